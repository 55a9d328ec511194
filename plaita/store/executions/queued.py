"""Starts a producer recorded and no worker took over yet: the ``queued`` execution record.

``FlowClient.start`` sends one script (``enqueue_start``) that answers the start's dedup key,
writes the execution's document with status ``queued`` plus its entry in the queued index, and
adds the start task to the execution's partition stream, all at once: a start is visible to
``get``, ``list``, ``cancel`` and the dashboard from the moment ``start`` returns, and two starts
with one dedup key get one id. The worker's create (``create_execution``) takes the record over
atomically. While it is queued only the holder of the start's lease rewrites it
(``rewrite_queued``: what it waits for, or its end when its start is dead-lettered).

A start asking for a flow version no live worker runs waits (``plaita.flows.runner.queued``); the
time it began to wait is kept in ``Keyspace.version_wait_key`` (for starts of producers that write
no record too). A mixin of ``ExecutionStore``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, cast

import redis

from plaita.store import scripts
from plaita.store.errors import refused_by_acl
from plaita.store.executions.execution_docs import reply_text
from plaita.store.executions.staged import ExecutionKeyError
from plaita.store.keyspace import TENANTS_KEY, Keyspace
from plaita.store.streams.delayed import DelayedMember, delayed_key, make_due_now
from plaita.tasks import PAYLOAD_FIELD, SCHEMA_FIELD, encode_body

#: The status of a start recorded by its producer and not yet taken over by a worker.
QUEUED = "queued"
#: The start dedup key lives this long (as a worker's create sets it), and so does a queued record
#: no worker takes over (a worker's create makes it a running execution, which does not expire).
DEDUP_TTL_S = 7 * 24 * 3600

ENQUEUE_START = scripts.script("enqueue_start")
REWRITE_QUEUED = scripts.script("rewrite_queued")


@dataclass(frozen=True)
class Enqueued:
    """What ``enqueue_start`` did: ``execution_id`` holds the start (the earlier execution's id
    when ``duplicate``); ``message_id`` is the task's stream entry id, or a delayed start's member id
    (``d-…``); None when nothing was added."""

    execution_id: str
    duplicate: bool
    message_id: str | None


class QueuedAccess:
    """The queued records of executions on one client, in ``ks``."""

    client: redis.Redis
    ks: Keyspace
    #: This tenant is in ``TENANTS_KEY`` (``ExecutionStore``; a platform key: a call of its own).
    _registered: bool

    def enqueue_start(
        self,
        execution_id: str,
        body: dict[str, Any],
        queued_json: str,
        *,
        stream: str,
        now_s: float,
        dedup_key: str | None,
        delayed: DelayedMember | None = None,
    ) -> Enqueued:
        """Record ``execution_id`` as queued (document ``queued_json``) and add the start ``body``
        to its stream, unless ``dedup_key`` is held (then nothing is written and the holder's id
        is returned). A start of an execution that exists is enqueued, its document kept.
        ``stream``: the stream of the execution's partition (the producer's queue names it).
        ExecutionKeyError (nothing written) when one of the keys holds the wrong type. The dedup
        key must be in the execution's partition (``FlowClient`` picks ids there). ``delayed``: a
        delayed start, the body's member (``plaita.store.streams.delayed.delayed_member``): it waits
        in the stream's delayed set until due, the record and dedup key live that much longer, and
        the record is indexed at its due time (so the index drops it when the record expires)."""
        if not self._registered:  # the tenant's counts and listings must find its queued starts
            self.client.sadd(TENANTS_KEY, self.ks.tenant)
            self._registered = True
        ks = self.ks
        p = ks.partition_of(execution_id)
        keys = [ks.execution_key(execution_id), ks.status_key(p, QUEUED), stream]
        if dedup_key is not None:
            keys.append(ks.dedup_key(p, dedup_key))
        ttl_s = DEDUP_TTL_S
        if delayed is not None:
            keys[2] = delayed_key(stream)
            ttl_s += max(0, math.ceil(delayed.due_ms / 1000 - now_s))
            now_s = delayed.due_ms / 1000
        args = [execution_id, queued_json, repr(now_s), encode_body(body), "1", ttl_s, PAYLOAD_FIELD, SCHEMA_FIELD]
        args += [delayed.due_ms, delayed.member] if delayed is not None else [0, ""]
        code, text = cast(list[Any], ENQUEUE_START(self.client, keys, args))
        text = reply_text(text)
        if int(code) == 4:
            raise ExecutionKeyError(text, "holds the wrong type")
        if int(code) == 2:
            return Enqueued(text, True, None)
        return Enqueued(execution_id, False, delayed.member_id if delayed is not None else text)

    def start_now(self, stream: str, due_ms: int, member_id: str) -> bool:
        """Make a delayed start's task (``member_id``, due at ``due_ms``) due now: a cancelled one
        is moved by the next reclaim pass and ends cancelled. False when it was moved already, or
        the user may not (an ACL without ZRANGEBYSCORE): then it ends cancelled when due."""
        try:
            return make_due_now(self.client, stream, due_ms, member_id)
        except redis.ResponseError as exc:
            if not refused_by_acl(exc):
                raise
            return False

    def rewrite_queued(
        self, execution_id: str, generation: int, doc_json: str, status: str, now_s: float, retention_s: int
    ) -> bool:
        """Replace a still ``queued`` document under the start's lease (fenced) with ``doc_json``,
        in the index of ``status``; ``retention_s`` > 0 gives it that TTL. False when refused
        (fenced out, no queued document: a worker took it over, or an index of the wrong type)."""
        ks, p = self.ks, self.ks.partition_of(execution_id)
        keys = [ks.lease_key(execution_id), ks.fence_key(execution_id), ks.execution_key(execution_id)]
        keys += [ks.status_key(p, QUEUED), ks.status_key(p, status)]
        args = [generation, doc_json, repr(now_s), execution_id, retention_s]
        return int(cast(int, REWRITE_QUEUED(self.client, keys, args))) == 1

    def version_wait(self, execution_id: str, now_s: float, ttl_s: float) -> tuple[float, int]:
        """(since, hand-backs so far, this one included) of a start of ``execution_id`` waiting for a
        version no live worker runs: ``since`` is set by the first call and kept ``ttl_s``."""
        key = self.ks.version_wait_key(execution_id)
        pipe = self.client.pipeline(transaction=False)  # one key: in order on one connection, any server
        pipe.hsetnx(key, "since", repr(now_s))
        pipe.hincrby(key, "n", 1)
        pipe.expire(key, max(1, int(ttl_s)))  # renewed while it waits; gone a while after
        pipe.hget(key, "since")
        _, n, _, since = pipe.execute()
        return float(reply_text(since)), int(n)

    def forget_version_wait(self, execution_id: str) -> None:
        """Drop the wait record (its start was dead-lettered: a requeue waits afresh)."""
        self.client.delete(self.ks.version_wait_key(execution_id))
