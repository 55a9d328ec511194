"""A restart (``FlowClient.retry``), on ``MemoryIO`` (no server): a terminal execution reopened
at a step, written before the step runs, and known by its resume id."""

from __future__ import annotations

from plaita.flows import Flow, StepContext
from plaita.flows.model.bodies import restart_body
from tests.flows.memory import memory_runner, start

BROKEN: set[str] = set()

fixable = Flow("fixable")


@fixable.step
def a(ctx: StepContext) -> str:
    return "a"


@fixable.step(max_attempts=1)
def b(ctx: StepContext) -> str:
    if ctx.execution_id in BROKEN:
        raise RuntimeError("broken")
    return "b"


def _restart(eid: str, rid: str, *, force: bool = False) -> dict[str, object]:
    return restart_body(eid, flow_id="fixable", from_step=None, force=force, by="ann@test", resume_id=rid)


def test_a_restart_reopens_the_error_execution_at_its_step_and_keeps_what_came_before() -> None:
    BROKEN.add("t1")
    with memory_runner([fixable]) as m:
        assert (m.run(start("t1", "fixable")) or {})["status"] == "error"
        BROKEN.discard("t1")
        doc = m.run(_restart("t1", "x1"))
        whats = [w.what for w in m.io.writes]
    assert doc is not None and doc["status"] == "completed" and doc["results"] == {"a": "a", "b": "b"}
    assert whats.count("reopen") == 1 and whats.index("reopen") < len(whats) - 1  # before the step
    assert "x1" in doc["applied_resumes"]


def test_a_restart_delivered_twice_reopens_once() -> None:
    BROKEN.add("t2")
    with memory_runner([fixable]) as m:
        m.run(start("t2", "fixable"))
        BROKEN.discard("t2")
        m.run(_restart("t2", "x1"))
        before = len(m.io.writes)
        m.run(_restart("t2", "x1"))
        assert len(m.io.writes) == before


def test_a_completed_execution_is_reopened_only_when_forced() -> None:
    with memory_runner([fixable]) as m:
        m.run(start("t3", "fixable"))
        before = len(m.io.writes)
        m.run(_restart("t3", "x1"))
        assert len(m.io.writes) == before
        doc = m.run(_restart("t3", "x2", force=True))
    assert doc is not None and doc["status"] == "completed" and "x2" in doc["applied_resumes"]
