"""A flow changed since an execution started, on ``MemoryIO`` (no server): a compatible version
continues it, an incompatible one ends it ``error`` (``FlowChanged``) when no worker can."""

from __future__ import annotations

from typing import Any

from plaita.flows import Flow, StepContext
from tests.flows.memory import memory_runner, resume, start


def _flow(version: str, steps: list[str], compatible_with: tuple[str, ...] = ()) -> Flow:
    flow = Flow("evolving", version=version, compatible_with=compatible_with)
    for name in steps:

        def step(ctx: StepContext, _name: str = name) -> Any:
            if _name == "wait" and ctx.resume is None:
                return ctx.suspend()
            return _name

        step.__name__ = name
        flow.step(step)
    return flow


def test_a_compatible_version_continues_the_execution() -> None:
    old, new = _flow("1", ["wait", "end"]), _flow("2", ["wait", "extra", "end"], compatible_with=("1",))
    with memory_runner([old]) as m:
        m.run(start("u1", "evolving"))
        docs = m.io.docs
    with memory_runner([new]) as m2:
        m2.io.docs.update(docs)
        doc = m2.run(resume("u1", "event", data=1, resume_id="r1"))
    assert doc is not None and doc["status"] == "completed"
    assert list(doc["results"]) == ["wait", "extra", "end"]


def test_an_incompatible_change_ends_the_execution_in_error() -> None:
    old, new = _flow("1", ["wait", "end"]), _flow("2", ["other", "end"])
    with memory_runner([old]) as m:
        m.run(start("u2", "evolving"))
        docs = m.io.docs
    with memory_runner([new]) as m2:
        m2.io.docs.update(docs)
        doc = m2.run(resume("u2", "event", data=1, resume_id="r1"))
    assert doc is not None and doc["status"] == "error" and doc["error"]["type"] == "FlowChanged"
