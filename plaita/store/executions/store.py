"""Every Redis access of flow executions: state, fenced checkpoints, the status index, cancel
flags, start dedup and suspension deadlines (the keeper's own calls: ``keeper_store``).

Keys (the names existing deployments and tools read; they do not change):

- ``plaita:execution:{id}``: the execution's state, one JSON string.
- ``plaita:execution:cancel:{id}``: cancel intent (any value), 7 days.
- ``plaita:execution:events:{id}``: what its steps published (``plaita.store.executions.events``).
- ``plaita:start-dedup:{key}``: the execution id a dedup key started, 7 days (set by the
  producer's start, ``plaita.store.executions.queued``, or by the worker's create for an older producer).
- ``plaita:executions:status:{status}``: one sorted set per status, member = execution id,
  score = last update (epoch seconds), so listing by status needs neither KEYS nor SCAN.
- ``plaita:executions:deadlines``: suspended executions with a deadline, scored by it.

A tenant's executions have the same keys in its namespace (``plaita:<tenant>:execution:{id}``, …:
``plaita.store.keyspace``): ``ExecutionStore.for_tenant``. Creating a tenant's first execution in
a process adds the tenant to ``plaita:tenants`` (the keeper's list of tenants).

A create and a checkpoint are one EVALSHA each, built beside the runner's adapter that sends
them (``plaita.store.executions.execution_io``: ``create_call``, ``checkpoint_call``): the lease
generation is checked inside Lua (a worker that lost its lease can never overwrite its
successor), then the state, the status index, the deadline and the step's staged writes are
written together. Every key a script touches is in KEYS.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import redis

from plaita.store import scripts
from plaita.store.client import get_many
from plaita.store.executions import fanout
from plaita.store.executions.events import EventAccess
from plaita.store.executions.execution_docs import UnreadableExecution, checked, reply_text
from plaita.store.executions.keeper_store import KeeperAccess
from plaita.store.executions.queued import QUEUED, Enqueued, QueuedAccess
from plaita.store.executions.staged import STAGE_OPS, ExecutionKeyError, Staged, StagedWriteRefused
from plaita.store.keyspace import (
    CANCEL_PREFIX,
    DEADLINES_KEY,
    DEDUP_PREFIX,
    DEFAULT,
    EXECUTION_PREFIX,
    STATUS_PREFIX,
    TENANTS_KEY,
    Keyspace,
)
from plaita.store.streams.stream_scan import start_queued, stream_execution_ids
from plaita.tasks import TENANT_ID, Task

__all__ = [
    "CANCEL_PREFIX",
    "DEADLINES_KEY",
    "DEDUP_PREFIX",
    "EXECUTION_PREFIX",
    "QUEUED",
    "Enqueued",
    "STAGE_OPS",
    "STATUS_PREFIX",
    "TENANTS_KEY",
    "ExecutionKeyError",
    "ExecutionStore",
    "Staged",
    "StagedWriteRefused",
    "UnreadableExecution",
    "stream_execution_ids",
]
#: Statuses a checkpoint writes, in the order the checkpoint script receives their index keys.
STATUSES = ("running", "suspended", "completed", "error", "cancelled")
#: Every status a document holds: also ``queued``, a start recorded by its producer that no worker
#: took over yet (only the start path writes it: ``plaita.store.executions.queued``).
ALL_STATUSES = (QUEUED, *STATUSES)
TERMINAL = frozenset({"completed", "error", "cancelled"})
#: Cancel flags and dedup keys outlive any execution that could still use them.
FLAG_TTL_S = 7 * 24 * 3600
#: Stream entries ``start_queued`` reads at most (a cancel of an id with no document yet).
MAX_SCANNED_ENTRIES = 100_000
#: Tenant stores one store keeps (then it starts over: tenant ids come from task bodies).
MAX_CACHED_TENANTS = 1024


REOPEN = scripts.script("reopen_execution")


class ExecutionStore(KeeperAccess, EventAccess, QueuedAccess):
    """Execution state on one Redis client (bytes replies), in one queue's ``keyspace``.

    With partitions each execution's keys carry its partition's hash tag; the per-status and
    deadline indexes are one per partition, and the listings here merge them.
    """

    def __init__(self, client: redis.Redis, keyspace: Keyspace = DEFAULT) -> None:
        self.client = client
        self.ks = keyspace
        self._tenants: dict[str, ExecutionStore] = {}
        #: This tenant is in ``TENANTS_KEY`` (added by the first create of this store).
        self._registered = not keyspace.tenant

    @classmethod
    def sharing(cls, queue: Any) -> ExecutionStore:
        """The executions of ``queue``'s keyspace, on its client (a ``StreamQueue``)."""
        return cls(queue.client, queue.keyspace)

    # -- tenants ---------------------------------------------------------------------------
    def for_tenant(self, tenant_id: str | None) -> ExecutionStore:
        """The same client's store of ``tenant_id``'s executions (None, "" or "default": the default
        tenant's); cached. ValueError for an invalid tenant id."""
        ks = self.ks.for_tenant(tenant_id)
        if ks == self.ks:
            return self
        store = self._tenants.get(ks.ns)
        if store is None:
            if len(self._tenants) >= MAX_CACHED_TENANTS:  # bounded: ids come from task bodies
                self._tenants.clear()
            store = self._tenants[ks.ns] = ExecutionStore(self.client, ks)
        return store

    def of(self, task: Task) -> ExecutionStore:
        """The store of the tenant ``task`` belongs to (its body's ``tenant_id``)."""
        return self.for_tenant(task.tenant_id) if task.tenant_id else self

    def tenants(self) -> list[str]:
        """Every tenant (but the default one) with executions, sorted; invalid members are skipped."""
        members = (reply_text(m) for m in cast(set[Any], self.client.smembers(TENANTS_KEY)))
        return sorted(t for t in members if TENANT_ID.fullmatch(t))

    # -- the worker's path ---------------------------------------------------------------
    def load(self, execution_id: str) -> tuple[dict[str, Any] | None, bool]:
        """(state or None, cancel requested) in one round trip."""
        key = self.ks.execution_key(execution_id)
        raw, flag = cast(list[Any], self.client.mget([key, self.ks.cancel_key(execution_id)]))
        return self.parse(execution_id, raw), flag is not None

    def parse(self, execution_id: str, raw: Any) -> dict[str, Any] | None:
        """The state in ``raw`` (a GET of the execution key); UnreadableExecution when it holds none."""
        doc = checked(execution_id, self.ks.execution_key(execution_id), raw)
        if isinstance(doc, UnreadableExecution):
            raise doc
        return doc

    @property
    def registered(self) -> bool:
        """This store's tenant is in ``TENANTS_KEY`` (its creates need no SADD first)."""
        return self._registered

    def register(self) -> None:
        """Add this store's tenant to ``TENANTS_KEY`` (before its first execution exists: the
        keeper must find every tenant's); once per store."""
        if not self._registered:
            self.client.sadd(TENANTS_KEY, self.ks.tenant)
            self._registered = True

    def reopen(
        self, execution_id: str, generation: int, state_json: str, now_s: float, rerun_steps: Sequence[str] = ()
    ) -> bool:
        """A terminal execution back to ``running`` under the lease (a restart): index, no TTL (on
        its events either), cancel flag deleted, the events published by ``rerun_steps`` deleted,
        in one fenced call. False when fenced out; ExecutionKeyError (nothing written) when the
        running index holds the wrong type."""
        ks, p = self.ks, self.ks.partition_of(execution_id)
        keys = [ks.lease_key(execution_id), ks.fence_key(execution_id), ks.execution_key(execution_id)]
        keys += [ks.cancel_key(execution_id), ks.deadlines_key(p), *(ks.status_key(p, s) for s in STATUSES)]
        keys.append(ks.events_key(execution_id))
        args = [generation, state_json, repr(now_s), execution_id, *rerun_steps]
        reply = cast(list[Any], REOPEN(self.client, keys, args))
        if int(reply[0]) == 3:
            raise ExecutionKeyError(reply_text(reply[1]), reply_text(reply[2]))
        return int(reply[0]) == 1

    def cancel_requested_many(self, execution_ids: Sequence[str]) -> list[bool]:
        return [v is not None for v in get_many(self.client, [self.ks.cancel_key(e) for e in execution_ids])]

    # -- producers and operators ---------------------------------------------------------
    def get(self, execution_id: str) -> dict[str, Any] | None:
        """The state, or None; UnreadableExecution when the key holds no execution."""
        [doc] = self.read_many([execution_id])
        if isinstance(doc, UnreadableExecution):
            raise doc
        return doc

    def read_many(self, execution_ids: Sequence[str]) -> list[dict[str, Any] | None | UnreadableExecution]:
        """Each execution's state (None = no key) in one round trip; an unreadable key is
        returned as its UnreadableExecution instead of failing the others."""
        if not execution_ids:
            return []
        keys = [self.ks.execution_key(e) for e in execution_ids]
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.get(key)
        raws = pipe.execute(raise_on_error=False)
        return [checked(e, k, raw) for e, k, raw in zip(execution_ids, keys, raws, strict=True)]

    def request_cancel(self, execution_id: str, *, ttl_s: int = FLAG_TTL_S) -> None:
        """Set the cancel flag for ``ttl_s`` (longer for a delayed start: until it is due and read)."""
        self.client.set(self.ks.cancel_key(execution_id), "1", ex=ttl_s)

    def request_cancels(self, execution_ids: Sequence[str]) -> None:
        """Set the cancel flag of each execution (one pipeline; children, descendants)."""
        fanout.request_cancels(self.client, self.ks, execution_ids)

    def enqueue_tasks(self, bodies: Sequence[dict[str, Any]]) -> None:
        """Add a task per body to the stream of its execution's partition (one pipeline)."""
        fanout.enqueue_tasks(self.client, self.ks, bodies)

    def start_queued(self, execution_id: str, stream: str, max_entries: int = MAX_SCANNED_ENTRIES) -> bool | None:
        """Whether a start of this tenant's ``execution_id`` waits in ``stream`` (its partition's
        stream: not read yet, handed back to wait for a flow slot, or read and not acked): XRANGE
        pages, at most ``max_entries`` entries; None when it was not among them and there are more."""
        return start_queued(self.client, stream, execution_id, self.ks.tenant, max_entries)

    def dedup_target(self, key: str) -> str | None:
        """The execution a dedup key started. With partitions a dedup key lives in the partition
        its own text hashes to (``FlowClient.start`` picks execution ids there)."""
        raw = self.client.get(self.ks.dedup_key(self.ks.partition_of(key), key))
        return None if raw is None else reply_text(raw)

    def _index(self, status: str, first: int, last: int, *, newest: bool) -> list[tuple[int, str, float]]:
        """(partition, id, score) of ranks ``first..last`` of ``status`` over every partition."""
        rows: list[tuple[int, str, float]] = []
        for p in range(len(self.ks.tags)):
            key = self.ks.status_key(p, status)
            rng = self.client.zrevrange if newest else self.client.zrange
            raw = rng(key, 0 if len(self.ks.tags) > 1 else first, last, withscores=True)
            rows += [(p, reply_text(m), float(score)) for m, score in cast(list[Any], raw)]
        rows.sort(key=lambda r: -r[2] if newest else r[2])
        return rows[first : last + 1] if len(self.ks.tags) > 1 else rows

    def by_status(self, status: str, limit: int, *, offset: int = 0, prune: bool = False) -> list[dict[str, Any]]:
        """The most recently updated executions with ``status``, skipping the newest ``offset``
        (unreadable keys left out: ``listing`` names them)."""
        return self.listing(status, limit, offset=offset, prune=prune)[0]

    def listing(
        self, status: str, limit: int, *, offset: int = 0, prune: bool = False
    ) -> tuple[list[dict[str, Any]], list[UnreadableExecution]]:
        """(states, unreadable keys) of ranks ``offset..offset+limit-1`` of ``status``, newest
        first. Reads only, unless ``prune``: then index entries with no key at all (expired
        state) are dropped; an unreadable key is never touched (it may still be repaired)."""
        first = max(0, offset)
        rows = self._index(status, first, first + max(0, limit - 1), newest=True)
        docs: list[dict[str, Any]] = []
        bad: list[UnreadableExecution] = []
        for (p, eid, _), doc in zip(rows, self.read_many([e for _, e, _ in rows]), strict=True):
            if isinstance(doc, UnreadableExecution):
                bad.append(doc)
            elif doc is not None:
                docs.append(doc)
            elif prune:
                self.client.zrem(self.ks.status_key(p, status), eid)
        return docs, bad

    def counts(self) -> dict[str, int]:
        pipe = self.client.pipeline(transaction=False)
        for s in ALL_STATUSES:
            for p in range(len(self.ks.tags)):
                pipe.zcard(self.ks.status_key(p, s))
        totals = [int(n) for n in pipe.execute()]
        width = len(self.ks.tags)
        return {s: sum(totals[i * width : (i + 1) * width]) for i, s in enumerate(ALL_STATUSES)}
