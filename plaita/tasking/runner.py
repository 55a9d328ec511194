"""The worker's handler of named tasks (``plaita worker --tasks MODULE``).

Each delivery runs the task its body names (``registry.parse_call``) with its arguments, on the
handler's thread (an ``async def`` task on an event loop of its own there) or, with ``--pool
process``, in a child (the function pickled by its module path). Then:

- it returned: its value is kept as its result for ``result_ttl_s`` (if the task keeps one) and
  the entry is acked;
- it raised, attempts left: a copy of the body with ``attempt + 1`` waits for its backoff in its
  stream's delayed set (``plaita.store.streams.delayed``; no worker slot is held meanwhile), and
  the entry is acked; any worker's reclaim pass puts it back on the stream once due, so it runs
  within about one ``--reclaim-interval-s`` after its backoff;
- it raised on its last attempt (or raised ``BadTaskError``): the entry goes to the DLQ with the
  error as its reason, and the error is kept as its result (``TaskClient.result`` raises it).

A task name this worker does not know is a bad task: to the DLQ at once, saying so. The entry is
acked only after the retry or result is written, so a Redis failure in between re-runs the
attempt (at-least-once), never loses it.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable
from typing import Any, NamedTuple

from plaita.errors import BadTaskError
from plaita.runtime.procchild import ChildServices
from plaita.runtime.procpool import ProcessPool
from plaita.store.task_store import TaskStore
from plaita.tasking.registry import TaskCall, TaskDef, TaskRegistry, parse_call
from plaita.tasks import Task, short_repr

logger = logging.getLogger(__name__)

#: How long the error of a body refused before its task was known (an unknown name) is kept.
REFUSED_RESULT_TTL_S = 3600.0
#: Longest list of task names the worker registry shows.
FLEET_NAMES_CHARS = 120
#: Longest error message kept in a result or a DLQ reason.
ERROR_CHARS = 500


class CallJob(NamedTuple):
    """One task call sent to a child (``--pool process``): the function goes by its module path."""

    fn: Callable[..., Any]
    args: list[Any]
    kwargs: dict[str, Any]

    def __call__(self, services: ChildServices) -> Any:
        value = self.fn(*self.args, **self.kwargs)
        if inspect.isawaitable(value):
            return services.loop.run_until_complete(value)
        return value


def _no_requests(kind: str, *args: Any) -> Any:
    raise RuntimeError(f"a named task has no {kind!r} call")


def _await(value: Any) -> Any:
    async def wait() -> Any:
        return await value

    return asyncio.run(wait())


class TaskRunner:
    """A sync handler (the worker runs it on ``--concurrency`` threads) of a registry's tasks."""

    #: Tells the worker's intake that a body's ``type`` may be any task name.
    named_tasks = True

    def __init__(
        self,
        registry: TaskRegistry,
        store: TaskStore,
        *,
        pool: ProcessPool | None = None,
        time_limit_s: float | None = None,
    ) -> None:
        self.registry = registry
        self.store = store
        self.pool = pool
        self.time_limit_s = time_limit_s

    def __call__(self, task: Task) -> None:
        try:
            call = parse_call(task.body, task.message_id)
            definition = self.registry.get(call.name)
            if definition is None:
                known = ", ".join(self.registry.names())
                raise BadTaskError(f"no task named {short_repr(call.name)} in this worker's registry (it has: {known})")
        except BadTaskError as exc:
            self._refused(task, exc)
            raise
        try:
            value = self._run(definition, call, task)
        except BadTaskError as exc:  # the task says its input is bad: no retry
            self._record_error(definition, call, exc)
            raise
        except Exception as exc:
            self._failed(definition, call, task, exc)
            return
        self._succeeded(definition, call, value)

    def _refused(self, task: Task, exc: BadTaskError) -> None:
        """A body this worker cannot run: its producer's ``result`` says why (not a 7-day wait)."""
        task_id = task.body.get("task_id")
        if isinstance(task_id, str) and task_id:
            doc = {"state": "error", "error_type": "BadTaskError", "message": exc.reason[:ERROR_CHARS]}
            self.store.put_result(task_id, doc, REFUSED_RESULT_TTL_S)

    def _run(self, definition: TaskDef, call: TaskCall, task: Task) -> Any:
        if self.pool is not None:
            job = CallJob(definition.fn, call.args, call.kwargs)
            return self.pool.run(job, cancel=task.cancelled, time_limit_s=self.time_limit_s, on_request=_no_requests)
        value = definition.fn(*call.args, **call.kwargs)
        return _await(value) if inspect.isawaitable(value) else value

    def _succeeded(self, definition: TaskDef, call: TaskCall, value: Any) -> None:
        if definition.result_ttl_s is None:
            self.store.forget(call.task_id)
            return
        try:
            self.store.put_result(call.task_id, {"state": "done", "value": value}, definition.result_ttl_s)
        except (TypeError, ValueError) as exc:  # not JSON: say so where the caller looks
            self._record_error(definition, call, TypeError(f"its return value is not JSON ({exc})"))

    def _failed(self, definition: TaskDef, call: TaskCall, task: Task, exc: Exception) -> None:
        """A retry if attempts are left, else the DLQ (``BadTaskError`` with the error)."""
        error = f"{type(exc).__name__}: {str(exc)[:ERROR_CHARS]}"
        if call.attempt <= definition.retries:
            delay_s = definition.retry_delay_s(call.attempt)
            body = {**task.body, "task_id": call.task_id, "attempt": call.attempt + 1}
            self.store.add_later(body, delay_s)
            logger.warning(
                "task %s (%s) attempt %d of %d failed (%s); retry in %.2f s",
                call.task_id,
                call.name,
                call.attempt,
                definition.retries + 1,
                error,
                delay_s,
            )
            return
        self._record_error(definition, call, exc)
        raise BadTaskError(f"task {call.name!r} failed after {call.attempt} attempt(s): {error}") from exc

    def _record_error(self, definition: TaskDef, call: TaskCall, exc: BaseException) -> None:
        if definition.result_ttl_s is None:
            self.store.forget(call.task_id)
            return
        doc = {"state": "error", "error_type": type(exc).__name__, "message": str(exc)[:ERROR_CHARS]}
        self.store.put_result(call.task_id, doc, definition.result_ttl_s)

    def fleet_entry(self) -> dict[str, Any]:
        """What the registry shows this worker runs: ``tasks:`` and its task names (cut short)."""
        names = ",".join(self.registry.names())
        if len(names) > FLEET_NAMES_CHARS:
            names = f"{names[:FLEET_NAMES_CHARS]}... ({len(self.registry)} tasks)"
        return {"handler": f"tasks:{names}"}
