"""What the runner writes after each step, on ``MemoryIO`` (no server): one create, one
checkpoint per step, the last one ``completed``; the same in thread and loop mode."""

from __future__ import annotations

from typing import Any

import pytest

from plaita.flows import Flow, StepContext
from tests.flows.memory import memory_runner, start

three = Flow("three")


@three.step
def first(ctx: StepContext) -> dict[str, Any]:
    ctx.state["seen"] = ["first"]
    return {"n": ctx.params["n"]}


@three.step
def second(ctx: StepContext) -> int:
    ctx.state["seen"].append("second")
    return int(ctx.results["first"]["n"]) * 2


@three.step
def third(ctx: StepContext) -> str:
    return f"{ctx.results['second']}!"


@pytest.mark.parametrize("mode", ["thread", "loop"])
def test_a_create_then_one_checkpoint_per_step_the_last_completed(mode: str) -> None:
    """Every step ends in one checkpoint; the create comes first and nothing else is written."""
    with memory_runner([three]) as m:
        doc = (m.run if mode == "thread" else m.run_async)(start("w1", "three", n=4))
        writes = m.io.writes
    assert [w.what for w in writes] == ["create", "checkpoint", "checkpoint", "checkpoint"]
    assert [w.status for w in writes] == ["running", "running", "running", "completed"]
    assert doc is not None and doc["results"] == {"first": {"n": 4}, "second": 8, "third": "8!"}
    assert doc["state"]["seen"] == ["first", "second"]


def test_each_checkpoint_names_the_next_step_to_run() -> None:
    """A worker killed after step k's checkpoint leaves the index of step k+1 to run next."""
    with memory_runner([three]) as m:
        m.run(start("w2", "three", n=1))
        checkpoints = [w.doc for w in m.io.writes if w.what == "checkpoint"]
    assert [(d["step_index"], d["step"]) for d in checkpoints[:2]] == [(1, "second"), (2, "third")]
    assert [e["step"] for e in checkpoints[-1]["history"]] == ["first", "second", "third"]


def test_a_completed_execution_carries_no_deadline_and_no_staged_writes() -> None:
    """Plain steps stage nothing, and a running or ended execution has no suspension deadline."""
    with memory_runner([three]) as m:
        m.run(start("w3", "three", n=2))
        assert all(w.deadline_s is None and w.staged == () for w in m.io.writes)


def test_a_start_delivered_twice_runs_nothing_the_second_time() -> None:
    """The second delivery finds the execution completed: a no-op, nothing written."""
    with memory_runner([three]) as m:
        m.run(start("w4", "three", n=2))
        before = len(m.io.writes)
        m.run(start("w4", "three", n=2))
        assert len(m.io.writes) == before
