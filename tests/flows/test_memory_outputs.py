"""What a step's output may be, on ``MemoryIO`` (no server): staged writes ride with the
checkpoint; an output that is not JSON is a failed attempt; a state over the limit is ``error``."""

from __future__ import annotations

from typing import Any

from plaita.flows import Flow, StepContext
from tests.flows.memory import memory_runner, start

stager = Flow("stager")


@stager.step
def stage(ctx: StepContext) -> None:
    ctx.stage("greeting", "hello")
    ctx.stage_incr("count", 2)


odd = Flow("odd")


@odd.step(max_attempts=2, base_s=0.0, cap_s=0.0)
def not_json(ctx: StepContext) -> Any:
    return {1, 2}


big = Flow("big")


@big.step
def grow(ctx: StepContext) -> str:
    return "x" * 5000


def test_staged_writes_go_with_the_checkpoint_of_their_step() -> None:
    with memory_runner([stager]) as m:
        m.run(start("o1", "stager"))
        last = m.io.last("o1")
    assert last.status == "completed"
    assert [(s.key, s.op) for s in last.staged] == [("greeting", "set"), ("count", "incrby")]


def test_an_output_that_is_not_json_is_a_failed_attempt_then_error() -> None:
    """Nothing of the bad attempt is written; the retry meets the same value; ``error`` names it."""
    with memory_runner([odd]) as m:
        doc = m.run(start("o2", "odd"))
    assert doc is not None and doc["status"] == "error" and doc["error"]["step"] == "not_json"
    assert [e["outcome"] for e in doc["history"]] == ["failed", "error"]


def test_a_state_over_the_size_limit_ends_in_error_instead() -> None:
    """The document that cannot be written is replaced by the ``error`` one (``sealed``)."""
    with memory_runner([big], max_state_bytes=4096) as m:
        doc = m.run(start("o3", "big"))
    assert doc is not None and doc["status"] == "error" and "grow" not in doc["results"]
