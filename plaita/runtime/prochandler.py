"""A plain handler (``--handler``) run in the process pool (``--pool process``).

The worker's handler threads call ``ProcessHandler`` as they would call the handler itself; it
runs the handler in a child with a copy of the task (message id, body, delivery count, fencing
token, keyspace) and the task's cancel flag forwarded, and raises what the handler raised, or
``ChildProcessDied`` / ``StepTimeLimit`` / ``StepCancelled``: a failed delivery like any other
(``plaita.runtime.pool.judge``). Sync and ``async def`` handlers both run there.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, NamedTuple

from plaita.runtime.procchild import ChildServices
from plaita.runtime.procpool import ProcessPool
from plaita.tasks import Task


class TaskJob(NamedTuple):
    """One handler call, as sent to a child (pickled: the handler by its module path). A tuple:
    built and pickled per task, where a frozen dataclass cost several µs more of each."""

    handler: Callable[[Task], object]
    message_id: str
    body: dict[str, Any]
    delivery_count: int
    fencing_token: int
    keyspace: Any

    def __call__(self, services: ChildServices) -> None:
        task = Task(
            self.message_id,
            self.body,
            self.delivery_count,
            cancelled=services.cancel,
            fencing_token=self.fencing_token,
            keyspace=self.keyspace,
        )
        result = self.handler(task)
        if result is not None and inspect.isawaitable(result):  # most handlers return None: no check
            services.loop.run_until_complete(result)


def _job(handler: Callable[[Task], object], task: Task) -> TaskJob:
    return TaskJob(handler, task.message_id, task.body, task.delivery_count, task.fencing_token, task.keyspace)


def _no_requests(kind: str, *args: Any) -> Any:
    raise RuntimeError(f"a plain handler has no {kind!r} call")


class ProcessHandler:
    """``handler`` run in ``pool``; a sync callable for the thread pool (one thread per child)."""

    def __init__(self, handler: Callable[[Task], object], pool: ProcessPool, *, time_limit_s: float | None) -> None:
        self.handler = handler
        self.pool = pool
        self.time_limit_s = time_limit_s

    def __call__(self, task: Task) -> None:
        self.pool.run(
            _job(self.handler, task), cancel=task.cancelled, time_limit_s=self.time_limit_s, on_request=_no_requests
        )

    @property
    def batchable(self) -> bool:
        """Whether ``run_batch`` may be used: not with a time limit (a batch times no job alone)."""
        return self.time_limit_s is None

    def run_batch(self, tasks: list[Task]) -> list[BaseException | None]:
        """Run fast ``tasks`` in one round trip to a child (``ProcessPool.run_batch``): for each that
        ran, in order, None or what it raised (the last one: ``ChildProcessDied`` when the child died
        under it); the tasks after those did not start."""
        jobs = [_job(self.handler, task) for task in tasks]
        results, error = self.pool.run_batch(jobs, [t.cancelled for t in tasks], on_request=_no_requests)
        out: list[BaseException | None] = [None if ok else value for ok, value in results]
        return out if error is None else [*out, error]

    def fleet_entry(self) -> dict[str, Any]:
        """The registry names the handler run in the children, not this wrapper."""
        fn = self.handler
        name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
        return {"handler": f"{getattr(fn, '__module__', None) or type(fn).__module__}:{name}"}
