"""Fan-out and fan-in, on ``MemoryIO`` (no server): which child starts a spawn enqueues, the
parent's suspension on them, the notification that wakes it, and the join."""

from __future__ import annotations

from typing import Any

from plaita.flows import Flow, StepContext
from tests.flows.memory import MemoryRunner, memory_runner, start

parent = Flow("parent")


@parent.step
def fan(ctx: StepContext) -> Any:
    if ctx.children is None:
        return ctx.spawn("kid", [{"i": i} for i in range(int(ctx.params["n"]))])
    return [c.result for c in ctx.children]


kid = Flow("kid")


@kid.step
def work(ctx: StepContext) -> int:
    return int(ctx.params["i"]) * 10


def _children(m: MemoryRunner) -> list[dict[str, Any]]:
    return [b for b in m.io.enqueued if b.get("type") == "start"]


def test_a_spawn_enqueues_one_start_per_child_then_suspends_on_them() -> None:
    """Starts first, then the checkpoint: a crash between them re-runs the step, which finds them."""
    with memory_runner([parent, kid]) as m:
        doc = m.run(start("p1", "parent", n=3))
        starts = _children(m)
    assert [b["execution_id"] for b in starts] == ["p1:fan:0:0", "p1:fan:0:1", "p1:fan:0:2"]
    assert all(b["parent"]["id"] == "p1" and b["parent"]["count"] == 3 for b in starts)
    assert [b["parent"]["index"] for b in starts] == [0, 1, 2]
    assert doc is not None and doc["status"] == "suspended"
    assert doc["suspension"]["children"] == {"flow_id": "kid", "prefix": "p1:fan:0", "count": 3}


def test_only_the_last_child_to_end_wakes_its_parent_and_the_parent_joins() -> None:
    """Each child marks itself done; the one completing the set enqueues one ``child`` resume;
    that resume runs the step again with every child's outcome."""
    with memory_runner([parent, kid]) as m:
        m.run(start("p2", "parent", n=2))
        first, second = _children(m)
        m.run(first)
        assert [b for b in m.io.enqueued if b.get("type") == "resume"] == []
        m.run(second)
        wakes = [b for b in m.io.enqueued if b.get("type") == "resume"]
        assert len(wakes) == 1 and wakes[0]["resume_type"] == "child" and wakes[0]["execution_id"] == "p2"
        doc = m.run(wakes[0])
    assert doc is not None and doc["status"] == "completed" and doc["results"]["fan"] == [0, 10]
    assert m.io.done[("p2", "p2:fan:0")] is None  # the join closed the done set


def test_a_re_run_spawning_step_starts_no_second_set() -> None:
    """The step runs again before its join (a redelivery): the same children, none new."""
    with memory_runner([parent, kid]) as m:
        m.run(start("p3", "parent", n=2))
        for body in _children(m):
            m.run(body)
        m.io.docs["p3"]["status"] = "running"  # its worker died before the suspension was kept
        m.io.docs["p3"]["suspension"] = None
        m.run(start("p3", "parent", n=2))
        starts = _children(m)
    assert len(starts) == 2  # every child existed: joined at once, nothing enqueued again
    assert m.io.docs["p3"]["status"] == "completed"


def test_children_that_all_ended_before_the_suspension_are_joined_at_once() -> None:
    """Right after the suspension checkpoint the spawning task looks at the done set once more."""
    with memory_runner([parent, kid]) as m:
        real_checkpoint = m.io.checkpoint

        async def children_first(task: Any, document: str, **kw: Any) -> tuple[bool, bool]:
            written = await real_checkpoint(task, document, **kw)
            if kw["status"] == "suspended":
                m.io.done[("p4", "p4:fan:0")] = {0, 1}
                for body in _children(m):
                    m.io.docs[body["execution_id"]] = {"status": "completed", "step": "work", "results": {"work": 7}}
            return written

        m.io.checkpoint = children_first  # type: ignore[method-assign]
        doc = m.run(start("p4", "parent", n=2))
    assert doc is not None and doc["status"] == "completed" and doc["results"]["fan"] == [7, 7]
