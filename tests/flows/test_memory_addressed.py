"""Addressed resumes (``wait_for``), on ``MemoryIO`` (no server): one for a wait the execution
is not in is kept, and taken at once when the execution reaches that wait."""

from __future__ import annotations

from typing import Any

from plaita.flows import Flow, StepContext
from tests.flows.memory import memory_runner, resume, start

two_waits = Flow("two_waits")


@two_waits.step
def first(ctx: StepContext) -> Any:
    return ctx.suspend(wait_for="approval") if ctx.resume is None else ctx.resume.data


@two_waits.step
def second(ctx: StepContext) -> Any:
    return ctx.suspend(wait_for="payment") if ctx.resume is None else ctx.resume.data


def test_a_resume_for_a_later_wait_is_kept_then_taken_without_suspending_again() -> None:
    with memory_runner([two_waits]) as m:
        m.run(start("i1", "two_waits"))
        early = m.run(resume("i1", "event", data="paid", resume_id="p1", wait_for="payment"))
        assert early is not None and early["status"] == "suspended" and early["suspension"]["step"] == "first"
        doc = m.run(resume("i1", "event", data="ok", resume_id="a1", wait_for="approval"))
    assert doc is not None and doc["status"] == "completed"
    assert doc["results"] == {"first": "ok", "second": "paid"}


def test_an_unaddressed_resume_ends_whichever_wait_the_execution_is_in() -> None:
    with memory_runner([two_waits]) as m:
        m.run(start("i2", "two_waits"))
        doc = m.run(resume("i2", "event", data="x", resume_id="u1"))
    assert doc is not None and doc["status"] == "suspended" and doc["suspension"]["step"] == "second"
