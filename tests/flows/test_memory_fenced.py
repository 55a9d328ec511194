"""A lease that moved on, on ``MemoryIO`` (no server): every refused write is a LeaseLostError
and nothing of the step is kept."""

from __future__ import annotations

from typing import Any

import pytest

from plaita.errors import LeaseLostError
from plaita.flows import Flow, StepContext
from tests.flows.memory import memory_runner, start

two = Flow("two")


@two.step
def a(ctx: StepContext) -> int:
    return 1


@two.step
def b(ctx: StepContext) -> int:
    return 2


def test_a_refused_create_is_a_lost_lease_and_no_step_runs() -> None:
    with memory_runner([two]) as m:
        m.io.fenced.add("f1")
        with pytest.raises(LeaseLostError, match="before it was created"):
            m.run(start("f1", "two"))
        assert m.io.writes == []


def test_a_refused_checkpoint_is_a_lost_lease_and_stops_the_task() -> None:
    """The lease went during step a: its checkpoint is refused, step b never runs here."""
    with memory_runner([two]) as m:
        real_create = m.io.create

        async def fenced_after_create(*args: Any) -> tuple[int, str, bool]:
            created = await real_create(*args)
            m.io.fenced.add("f2")
            return created

        m.io.create = fenced_after_create  # type: ignore[method-assign]
        with pytest.raises(LeaseLostError, match="no longer current"):
            m.run(start("f2", "two"))
    assert [w.what for w in m.io.writes] == ["create"]


def test_a_lost_lease_seen_before_a_step_stops_the_task_without_a_write() -> None:
    """``task.cancelled`` (the renewer lost the lease) is checked before each step."""
    with memory_runner([two]) as m:
        task = m.task(start("f3", "two"))
        task.cancelled.set()
        with pytest.raises(LeaseLostError):
            m.runner(task)
    assert [w.what for w in m.io.writes] == ["create"]
