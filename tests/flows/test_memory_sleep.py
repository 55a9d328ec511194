"""A durable sleep, on ``MemoryIO`` (no server): a suspension whose deadline runs the next step."""

from __future__ import annotations

from typing import Any

from plaita.flows import Flow, StepContext
from tests.flows.memory import memory_runner, resume, start

napper = Flow("napper")


@napper.step
def nap(ctx: StepContext) -> Any:
    return ctx.sleep(30)


@napper.step
def wake(ctx: StepContext) -> str:
    return "awake"


def test_a_sleep_is_a_suspension_with_its_wake_time_as_deadline() -> None:
    """The checkpoint says ``suspended`` with the deadline now + seconds, and names the next step."""
    with memory_runner([napper], clock=lambda: 500.0) as m:
        doc = m.run(start("z1", "napper"))
        last = m.io.last("z1")
    assert doc is not None and doc["status"] == "suspended" and last.deadline_s == 530.0
    assert doc["suspension"]["next"] == "wake"


def test_the_keepers_continue_runs_the_next_step_without_rerunning_the_sleeping_one() -> None:
    """``continue`` (the keeper's, at the deadline) ends the sleep: the next step runs."""
    with memory_runner([napper]) as m:
        m.run(start("z2", "napper"))
        doc = m.run(resume("z2", "continue", resume_id="wake-1"))
    assert doc is not None and doc["status"] == "completed" and doc["results"]["wake"] == "awake"
    assert [e["step"] for e in doc["history"] if e["outcome"] == "ok"] == ["wake"]


def test_an_event_does_not_cut_a_sleep_short() -> None:
    """Any resume but a wake is ignored while the execution sleeps: nothing written."""
    with memory_runner([napper]) as m:
        m.run(start("z3", "napper"))
        before = len(m.io.writes)
        doc = m.run(resume("z3", "event", data=1, resume_id="e1"))
    assert doc is not None and doc["status"] == "suspended" and len(m.io.writes) == before
