"""Named tasks' keys: their results (kept for a TTL) and their retries waiting for a due time.

Keys (``<stream>`` is the queue's stream, or each partition's hash-tagged one):

====================== ====================================== ============================
what                   key                                    type
====================== ====================================== ============================
a task's result        ``<queue>:result:<task_id>``           string (JSON), with a TTL
tasks not yet due      ``<stream>:task-due``                  sorted set: body -> due ms
====================== ====================================== ============================

A result key is one key per call (any slot on a cluster); a retry set shares its stream's hash
tag, so the script that moves due tasks onto the stream touches one slot. The due set holds a
named task's retries (waiting for their backoff) and ``TaskClient.enqueue(..., delay_s=)``'s tasks.
"""

from __future__ import annotations

import json
import time
from typing import Any, cast

import redis
from redis.client import Pipeline

from plaita.store.keyspace import Keyspace, key_id
from plaita.store.scripts import execute, script
from plaita.store.streams.queue import StreamQueue
from plaita.tasks import encode_body

#: Due tasks moved onto a stream per script call (a bounded call however many fell due at once).
PROMOTE_BATCH = 100
#: Passes of one ``promote_due`` call: at most this many batches per partition move per call.
PROMOTE_PASSES = 10
#: The ``schema_version`` of a due task's entry.
DUE_SCHEMA_VERSION = 1


class TaskStore:
    """The named tasks' results and retries of one queue."""

    def __init__(self, client: redis.Redis, keyspace: Keyspace) -> None:
        self.client = client
        self.keyspace = keyspace
        self._promote = script("promote_due_tasks")

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
    def due_key(self, p: int) -> str:
        return f"{self.keyspace.stream(p)}:task-due"

    def add_later(self, body: dict[str, Any], delay_s: float) -> None:
        """Put ``body`` on the stream once ``delay_s`` has passed (``promote_due`` moves it). The
        body must differ from every other waiting one (its task id and attempt number do)."""
        text = encode_body(body)
        eid = body.get("execution_id")  # where a worker expects it (else it would be misrouted)
        p = self.keyspace.partition_of(eid if isinstance(eid, str) and eid else text)
        due_ms = int((time.time() + max(0.0, delay_s)) * 1000)
        self.client.zadd(self.due_key(p), {text: due_ms})

    def promote_due(self) -> int:
        """Move every due task onto its stream; how many were moved. One pipeline a pass over
        every partition (grouped by node on a cluster); a partition that had a full batch due is
        passed over again, at most ``PROMOTE_PASSES`` times (the rest waits for the next call)."""
        now_ms = int(time.time() * 1000)
        moved, pending = 0, list(range(self.keyspace.partitions))
        for _ in range(PROMOTE_PASSES):
            if not pending:
                break

            def build(pipe: Pipeline, parts: list[int] = pending) -> None:
                for p in parts:
                    keys = [self.due_key(p), self.keyspace.stream(p)]
                    self._promote.queue(pipe, keys, [now_ms, PROMOTE_BATCH, DUE_SCHEMA_VERSION])

            counts = [int(n) for n in execute(self.client, build, [self._promote], transaction=False)]
            moved += sum(counts)
            pending = [p for p, n in zip(pending, counts, strict=True) if n >= PROMOTE_BATCH]
        return moved

    def waiting(self) -> int:
        """Tasks not yet due, over every partition."""
        counts = [int(self.client.zcard(self.due_key(p))) for p in range(self.keyspace.partitions)]
        return sum(counts)


def task_store_of(queue: StreamQueue) -> TaskStore:
    """The task store on ``queue``'s client and keys."""
    return TaskStore(queue.client, queue.keyspace)
