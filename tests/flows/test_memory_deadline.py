"""An execution's deadline, on ``MemoryIO`` (no server): past it, no step runs and the
execution ends ``cancelled``."""

from __future__ import annotations

from typing import Any

from plaita.flows import Flow, StepContext
from tests.flows.memory import memory_runner, start

NOW_S = 10_000.0
RAN: list[str] = []

timed = Flow("timed")


@timed.step
def wait(ctx: StepContext) -> Any:
    RAN.append(ctx.execution_id)
    return ctx.suspend(timeout_s=3600) if ctx.resume is None else None


def test_a_start_past_its_deadline_is_created_and_cancelled_without_a_step() -> None:
    with memory_runner([timed], clock=lambda: NOW_S) as m:
        doc = m.run({**start("d1", "timed"), "deadline_at": NOW_S - 1})
    assert doc is not None and doc["status"] == "cancelled" and "d1" not in RAN


def test_a_suspension_keeps_the_earlier_of_its_timeout_and_the_execution_deadline() -> None:
    """The keeper finds a suspension past the execution's deadline by the same index."""
    with memory_runner([timed], clock=lambda: NOW_S) as m:
        m.run({**start("d2", "timed"), "deadline_at": NOW_S + 60})
        last = m.io.last("d2")
    assert last.status == "suspended" and last.deadline_s == NOW_S + 60


def test_without_an_execution_deadline_the_suspension_deadline_is_its_timeout() -> None:
    with memory_runner([timed], clock=lambda: NOW_S) as m:
        m.run(start("d3", "timed"))
        assert m.io.last("d3").deadline_s == NOW_S + 3600
