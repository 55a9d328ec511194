"""Cancels, on ``MemoryIO`` (no server): a flag seen at admission, a completion refused for a
cancel, and a cancelled parent cancelling its children."""

from __future__ import annotations

from typing import Any

from plaita.flows import Flow, StepContext
from tests.flows.memory import memory_runner, resume, start

RAN: list[str] = []

once = Flow("once")


@once.step
def only(ctx: StepContext) -> str:
    RAN.append(ctx.execution_id)
    return "done"


fan = Flow("fan")


@fan.step
def spawn(ctx: StepContext) -> Any:
    return ctx.spawn("once", [{}, {}]) if ctx.children is None else None


def test_a_start_whose_cancel_flag_is_set_ends_cancelled_without_a_step() -> None:
    """The create reports the flag; the runner commits ``cancelled`` and runs nothing."""
    with memory_runner([once]) as m:
        m.io.cancelled.add("c1")
        doc = m.run(start("c1", "once"))
    assert doc is not None and doc["status"] == "cancelled" and "c1" not in RAN
    assert m.io.statuses("c1") == ["running", "cancelled"]


def test_a_completion_refused_for_a_cancel_ends_cancelled_instead() -> None:
    """The cancel came while the last step ran: its result is dropped, the execution is cancelled."""
    with memory_runner([once]) as m:
        real_create = m.io.create

        async def cancelled_after_create(*args: Any) -> tuple[int, str, bool]:
            created = await real_create(*args)
            m.io.cancelled.add("c2")
            return created

        m.io.create = cancelled_after_create  # type: ignore[method-assign]
        doc = m.run(start("c2", "once"))
    assert doc is not None and doc["status"] == "cancelled" and doc["results"] == {}
    assert m.io.statuses("c2") == ["running", "cancelled"]


def test_a_suspended_parent_cancelled_cancels_its_children() -> None:
    """Its cancel task ends it; then each child's flag is set and a suspended child gets a cancel."""
    with memory_runner([fan, once]) as m:
        m.run(start("c3", "fan"))
        kids = [b["execution_id"] for b in m.io.enqueued]
        m.io.docs[kids[0]] = {"status": "suspended", "flow_id": "once"}
        doc = m.run(resume("c3", "cancel", resume_id="x1"))
    assert doc is not None and doc["status"] == "cancelled"
    assert m.io.cancels_requested == kids
    cancels = [b for b in m.io.enqueued if b.get("resume_type") == "cancel"]
    assert [b["execution_id"] for b in cancels] == [kids[0]]
