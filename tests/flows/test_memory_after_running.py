"""Which checkpoints the runner marks ``after_running`` (``ExecutionIO.checkpoint``), on ``MemoryIO``
(no server): only those that follow this very task's own ``running`` write (its create, or its
previous checkpoint). The store adapter writes such a still-running checkpoint without moving
the execution between status indexes (``checkpoint_running``), so a wrong mark would leave an
execution listed under two statuses: a resume's first checkpoint, and one after a suspension,
must never carry it."""

from __future__ import annotations

from typing import Any

from plaita.flows import Flow, StepContext
from tests.flows.memory import memory_runner, resume, start

three = Flow("three-marks")


@three.step
def one(ctx: StepContext) -> int:
    return 1


@three.step
def two(ctx: StepContext) -> int:
    return 2


@three.step
def last(ctx: StepContext) -> int:
    return 3


waits = Flow("waits-marks")


@waits.step
def before(ctx: StepContext) -> int:
    return 0


@waits.step
def ask(ctx: StepContext) -> Any:
    if ctx.resume is None:
        return ctx.suspend(timeout_s=60)
    return ctx.resume.data


@waits.step
def after(ctx: StepContext) -> int:
    return 2


def _marks(m: Any, eid: str) -> list[tuple[str, str, bool]]:
    return [(w.what, w.status, w.after_running) for w in m.io.writes if w.execution_id == eid]


def test_every_checkpoint_after_a_create_follows_a_running_write_of_its_own() -> None:
    with memory_runner([three]) as m:
        m.run(start("m1", "three-marks"))
        assert _marks(m, "m1") == [
            ("create", "running", False),
            ("checkpoint", "running", True),
            ("checkpoint", "running", True),
            ("checkpoint", "completed", True),
        ]


def test_a_resume_marks_nothing_until_it_wrote_running_itself() -> None:
    with memory_runner([waits]) as m:
        m.run(start("m2", "waits-marks"))
        m.run(resume("m2", "event", data=1, resume_id="r1"))
        assert _marks(m, "m2") == [
            ("create", "running", False),
            ("checkpoint", "running", True),  # after `before`
            ("checkpoint", "suspended", True),  # `ask` suspends (a full write: the status moves)
            ("checkpoint", "running", False),  # the resume's task: the index says `suspended`
            ("checkpoint", "completed", True),
        ]
