"""Run tasks through a ``FlowRunner`` on ``MemoryIO``: the engine's decisions, no server.

What these tests check is what the runner asks for (``MemoryIO.writes``, ``enqueued``, ...);
what Redis then does with it is tested on real servers (the other tests of this folder).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from plaita.flows import Flow, FlowRunner
from plaita.flows.memory_io import MemoryIO
from plaita.tasks import Task

_ids = itertools.count(1)


class MemoryRunner:
    """A runner over ``flows`` on a fresh ``MemoryIO``; each task gets the next lease generation."""

    def __init__(self, flows: Iterable[Flow], **runner_options: Any) -> None:
        self.io = MemoryIO()
        self.runner = FlowRunner(list(flows), self.io, **runner_options)
        self._generation = itertools.count(1)

    def task(self, body: dict[str, Any]) -> Task:
        task = Task(f"{next(_ids)}-0", body, 1)
        task.fencing_token = next(self._generation)
        return task

    def run(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """``runner(task)`` as a handler thread calls it; the execution's last document."""
        task = self.task(body)
        self.runner(task)
        return self.io.docs.get(task.execution_id)

    def run_async(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """``await runner.run_async(task)`` as the worker's event loop calls it."""
        task = self.task(body)
        asyncio.run(self.runner.run_async(task))
        return self.io.docs.get(task.execution_id)

    def close(self) -> None:
        self.runner.close()


@contextmanager
def memory_runner(flows: Iterable[Flow], **runner_options: Any) -> Iterator[MemoryRunner]:
    m = MemoryRunner(flows, **runner_options)
    try:
        yield m
    finally:
        m.close()


def start(eid: str, flow: str, **params: Any) -> dict[str, Any]:
    return {"type": "start", "flow_id": flow, "execution_id": eid, "params": params}


def resume(eid: str, rtype: str = "event", data: Any = None, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"type": "resume", "execution_id": eid, "resume_type": rtype, **extra}
    if data is not None:
        body["data"] = data
    return body
