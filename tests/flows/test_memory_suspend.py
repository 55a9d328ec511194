"""A step that suspends, on ``MemoryIO`` (no server): the suspension checkpoint, its deadline,
and the resume that continues it."""

from __future__ import annotations

from typing import Any

from plaita.flows import Flow, StepContext
from tests.flows.memory import memory_runner, resume, start

waits = Flow("waits")


@waits.step
def ask(ctx: StepContext) -> Any:
    if ctx.resume is None:
        return ctx.suspend(timeout_s=60)
    return {"answer": ctx.resume.data, "type": ctx.resume.type}


@waits.step
def done(ctx: StepContext) -> str:
    return "ok"


def test_a_suspension_is_one_checkpoint_with_its_timeout_as_deadline() -> None:
    """The suspension is written with ``suspended`` and the deadline the keeper resumes at."""
    with memory_runner([waits], clock=lambda: 1000.0) as m:
        doc = m.run(start("s1", "waits"))
        last = m.io.last("s1")
    assert doc is not None and doc["status"] == "suspended"
    assert last.status == "suspended" and last.deadline_s == 1060.0
    assert doc["suspension"]["step"] == "ask"


def test_a_resume_runs_the_step_again_with_its_data_and_goes_on() -> None:
    """The resume's data reaches the step; the execution then completes."""
    with memory_runner([waits]) as m:
        m.run(start("s2", "waits"))
        doc = m.run(resume("s2", "event", data={"yes": 1}, resume_id="r1"))
    assert doc is not None and doc["status"] == "completed"
    assert doc["results"]["ask"] == {"answer": {"yes": 1}, "type": "event"}
    assert "r1" in doc["applied_resumes"]


def test_a_resume_delivered_twice_is_applied_once() -> None:
    """The second delivery of the same resume id writes nothing."""
    with memory_runner([waits]) as m:
        m.run(start("s3", "waits"))
        m.run(resume("s3", "event", data=1, resume_id="r1"))
        before = len(m.io.writes)
        m.run(resume("s3", "event", data=1, resume_id="r1"))
        assert len(m.io.writes) == before


def test_a_stale_timeout_is_ignored_once_the_execution_moved_on() -> None:
    """A timeout naming a suspension the execution has left is a no-op."""
    with memory_runner([waits]) as m:
        m.run(start("s4", "waits"))
        suspension = m.io.docs["s4"]["suspension"]
        m.run(resume("s4", "event", data=1, resume_id="r1"))
        before = len(m.io.writes)
        m.run(resume("s4", "timeout", resume_id="t1", suspension=suspension.get("id")))
        assert len(m.io.writes) == before
