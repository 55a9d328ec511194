"""The producer of named tasks: ``TaskClient.enqueue`` and ``TaskClient.result``.

``enqueue`` writes ``{"type": "task", "task": NAME, "args": [...], "kwargs": {...}, "task_id": ID}``
(after recording the id as queued, so ``result`` can tell "not finished" from "unknown");
``result`` polls the task's record until it is done, failed or ``timeout_s`` passed.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Unpack

from plaita.config import DEFAULT_QUEUE_NAME, DEFAULT_REDIS_URL
from plaita.errors import ConfigError
from plaita.store.keyspace import check_priority
from plaita.store.queue_access import QueueClient, QueueOptions, open_producer_queue
from plaita.store.streams.delayed import due_ms_of
from plaita.store.streams.queue import StreamQueue
from plaita.store.task_store import task_store_of
from plaita.tasking.errors import TaskFailed, TaskResultTimeout, UnknownTaskResult
from plaita.tasking.registry import NAMED_TYPE, task_name_of

#: How long an enqueued task's "queued" record lives (a task still queued after it reads as unknown).
QUEUED_RECORD_TTL_S = 7 * 24 * 3600.0
#: Polling interval of ``result``: it starts short and doubles up to this.
RESULT_POLL_MAX_S = 0.1


class TaskClient(QueueClient):
    """Enqueue named tasks and read their results. ``TaskClient.from_url(url)`` builds its own
    queue (close it, or use ``with``); ``TaskClient(queue)`` uses a queue the caller owns."""

    def __init__(self, queue: StreamQueue) -> None:
        super().__init__(queue)
        self.store = task_store_of(queue)

    @classmethod
    def from_url(cls, url: str = DEFAULT_REDIS_URL, **options: Unpack[QueueOptions]) -> TaskClient:
        """A client of the queue at ``url``; ``options`` (``queue_name`` and ``partitions``, which
        must be the workers', ``tls_ca_file``, ``tls_cert_file``, ``tls_key_file``,
        ``socket_timeout_s``) and their defaults: ``plaita.store.queue_access.open_producer_queue``.
        Connects lazily; ConfigError for a bad URL or an unreadable TLS file."""
        return cls(open_producer_queue(url, **options)).owning()

    def enqueue(
        self,
        task: str | Callable[..., Any],
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        *,
        task_id: str | None = None,
        delay_s: float | None = None,
        priority: int = 0,
    ) -> str:
        """Enqueue a call of ``task`` (its name, or the registered function); returns its task id
        (``task_id``, else a new one). ``delay_s``: it runs no earlier than that from now (it waits
        in its stream's delayed set; a worker's reclaim pass puts it on the stream when due).
        ``priority`` 0..9: higher levels are read first, none starved (docs/tasks.md); its retries
        keep it. ConfigError for arguments that are not JSON, a bad delay or a bad priority."""
        try:
            check_priority(priority)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        name, new_id = task_name_of(task), task_id or uuid.uuid4().hex
        body: dict[str, Any] = {
            "type": NAMED_TYPE,
            "task": name,
            "args": list(args),
            "kwargs": dict(kwargs or {}),
            "task_id": new_id,
        }
        if priority:
            body["priority"] = priority
        try:
            json.dumps(body)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"task {name!r}: its arguments must be JSON ({exc})") from None
        try:
            due_ms_of(delay_s, None, 0.0)  # refused before anything is written
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        self.store.mark_queued(new_id, QUEUED_RECORD_TTL_S + (delay_s or 0.0))
        if delay_s:
            self.store.add_later(body, delay_s)
        else:
            self.queue.enqueue(body, priority=priority)
        return new_id

    def result(self, task_id: str, *, timeout_s: float = 0.0) -> Any:
        """The task's return value once it has one, waiting up to ``timeout_s`` for it.
        ``TaskFailed`` if it failed for good, ``TaskResultTimeout`` if it had not finished by then,
        ``UnknownTaskResult`` if this queue has no record of it (never enqueued here, expired, or
        a task that keeps no result: ``result_ttl_s``)."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        pause_s = 0.005
        while True:
            doc = self.store.get_result(task_id)
            if doc is None:
                raise UnknownTaskResult(
                    f"no record of task {task_id!r} on this queue: never enqueued here, its result expired, "
                    "or its task keeps no result (@tasks.task(result_ttl_s=...))"
                )
            state = doc.get("state")
            if state == "done":
                return doc.get("value")
            if state == "error":
                raise TaskFailed(task_id, str(doc.get("error_type")), str(doc.get("message")))
            left_s = deadline - time.monotonic()
            if left_s <= 0:
                raise TaskResultTimeout(f"task {task_id!r} has not finished after {timeout_s} s (still {state})")
            time.sleep(min(pause_s, left_s))
            pause_s = min(RESULT_POLL_MAX_S, pause_s * 2)


def enqueue(
    task: str | Callable[..., Any],
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    *,
    redis_url: str = DEFAULT_REDIS_URL,
    queue_name: str = DEFAULT_QUEUE_NAME,
    partitions: int = 1,
    task_id: str | None = None,
    delay_s: float | None = None,
    priority: int = 0,
) -> str:
    """One ``TaskClient.enqueue`` on a client opened and closed for it; returns the task id.
    A program enqueuing often keeps a ``TaskClient`` instead (one connection pool)."""
    with TaskClient.from_url(redis_url, queue_name=queue_name, partitions=partitions) as tasks:
        return tasks.enqueue(task, args, kwargs, task_id=task_id, delay_s=delay_s, priority=priority)
