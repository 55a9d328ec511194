"""Named tasks' results (kept for a TTL), and their delayed enqueues and retries.

A task's result is ``<queue>:result:<task_id>`` (a JSON string with a TTL; one key per call, any
slot on a cluster). A task due later (``TaskClient.enqueue(..., delay_s=)``, a retry waiting for
its backoff) is no key of its own: ``add_later`` adds it to its stream's delayed set
(``plaita.store.streams.delayed``), which every worker's reclaim pass moves onto the stream when
due, like any delayed task.
"""

from __future__ import annotations

import json
from typing import Any, cast

from plaita.store.keyspace import PRIORITY_MAX, key_id
from plaita.store.streams.delayed import add_tasks
from plaita.store.streams.queue import StreamQueue


class TaskStore:
    """The named tasks' results and tasks due later of one queue."""

    def __init__(self, queue: StreamQueue) -> None:
        self.queue = queue
        self.client = queue.client
        self.keyspace = queue.keyspace

    # -- results -----------------------------------------------------------------------
    def result_key(self, task_id: str) -> str:
        return f"{self.keyspace.queue}:result:{key_id(task_id)}"

    def mark_queued(self, task_id: str, ttl_s: float) -> None:
        """Record that ``task_id`` was enqueued (so a wait on it is not "unknown"); never
        overwrites a result already there (a task enqueued twice with one id)."""
        doc = json.dumps({"state": "queued"})
        self.client.set(self.result_key(task_id), doc, nx=True, px=max(1, int(ttl_s * 1000)))

    def put_result(self, task_id: str, doc: dict[str, Any], ttl_s: float) -> None:
        """Keep ``doc`` (a JSON object) as the task's result for ``ttl_s``."""
        text = json.dumps(doc, ensure_ascii=False)
        self.client.set(self.result_key(task_id), text, px=max(1, int(ttl_s * 1000)))

    def forget(self, task_id: str) -> None:
        """Drop the task's record (a task that keeps no result)."""
        self.client.delete(self.result_key(task_id))

    def get_result(self, task_id: str) -> dict[str, Any] | None:
        """The task's record, or None when there is none (never enqueued here, or expired)."""
        raw = cast(bytes | None, self.client.get(self.result_key(task_id)))
        if raw is None:
            return None
        doc = json.loads(raw)
        return doc if isinstance(doc, dict) else {"state": "unreadable"}

    # -- tasks due later ------------------------------------------------------------------
    def add_later(self, body: dict[str, Any], delay_s: float) -> None:
        """Add ``body`` to its partition's delayed set, due ``delay_s`` from now (``wall_s``): a
        worker's reclaim pass puts it on the stream once due; a zero delay adds it now.
        ValueError for a delay that is not a finite number within 10 years (``due_ms_of``). The
        body's ``priority`` (a named task's, 1..9) keeps its level: a retry goes where it came from."""
        add_tasks(self.queue, [body], delay_s=delay_s, priority=body_priority(body))


def body_priority(body: dict[str, Any]) -> int:
    """The priority level a body asks for (its ``priority``, an int 1..9), else 0."""
    value = body.get("priority")
    return value if type(value) is int and 1 <= value <= PRIORITY_MAX else 0


def task_store_of(queue: StreamQueue) -> TaskStore:
    """The task store on ``queue``'s client and keys."""
    return TaskStore(queue)
