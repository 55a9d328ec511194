"""What a running step publishes (``ctx.publish``), on ``MemoryIO`` (no server): written at
once, not with the checkpoint, by the step's own task."""

from __future__ import annotations

from plaita.flows import Flow, StepContext
from tests.flows.memory import memory_runner, start

reporter = Flow("reporter")


@reporter.step
def report(ctx: StepContext) -> None:
    ctx.set_progress(0.5)
    ctx.publish("note", {"k": 1})


@reporter.step(max_attempts=1)
def bad(ctx: StepContext) -> None:
    ctx.publish("", 1)


def test_a_published_event_is_written_with_its_step() -> None:
    with memory_runner([reporter]) as m:
        m.run(start("e1", "reporter"))
        events = m.io.published["e1"]
    assert events["progress"]["value"] == 0.5 and events["progress"]["step"] == "report"
    assert events["note"]["value"] == {"k": 1}


def test_a_bad_event_name_fails_the_step_attempt() -> None:
    """ValueError from ``publish`` is the step's failure (its last attempt here): ``error``."""
    with memory_runner([reporter]) as m:
        doc = m.run(start("e2", "reporter"))
    assert doc is not None and doc["status"] == "error" and doc["error"]["step"] == "bad"
