"""What the keeper reads and writes of flow executions: its own lease, due deadlines, running
executions that stopped being updated, recovery marks, and the compare-and-set that ends an
orphaned execution. A mixin of ``ExecutionStore`` (it uses the store's client and keyspace).

The keeper lease is per queue (``keeper_lease_key``). An index the keeper reads (a tenant's
deadlines or status index, the tenants set) that holds another type of key raises
``UnreadableIndex`` naming it, so the keeper skips that index alone.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, cast

import redis

from plaita.errors import PlaitaError
from plaita.store import scripts
from plaita.store.client import interrupt
from plaita.store.executions.execution_docs import checked, is_wrongtype, reply_text
from plaita.store.keyspace import DEFAULT, TENANTS_KEY, Keyspace, key_id
from plaita.tasks import PAYLOAD_FIELD, SCHEMA_FIELD, encode_body

#: Set by the keeper when it enqueued a recovery ``retry``: one per cooldown per execution.
KEEPER_RETRY_PREFIX = "plaita:execution:keeper-retry:"
#: The keeper lease of the default queue (``plaita:flow:queue``), as before leases were per queue.
KEEPER_LEASE_KEY = "plaita:keeper:lease"

CLAIM_DEADLINES = scripts.script("claim_deadlines")
UNCLAIM_DEADLINES = scripts.script("unclaim_deadlines")
HOLD_KEEPER_LEASE = scripts.script("hold_keeper_lease")
RELEASE_KEEPER_LEASE = scripts.script("release_keeper_lease")


class UnreadableIndex(PlaitaError):
    """An index key of another type than plaita keeps there (not written by plaita): what it
    indexes is skipped, the key is left for an operator."""

    def __init__(self, key: str) -> None:
        super().__init__(f"{key} is not an index plaita wrote (wrong type)")
        self.key = key


@contextmanager
def index_of(key: str) -> Iterator[None]:
    """Turn a WRONGTYPE refusal of the calls inside into ``UnreadableIndex(key)``."""
    try:
        yield
    except redis.ResponseError as exc:
        if is_wrongtype(exc):
            raise UnreadableIndex(key) from None
        raise


def _replies(keys: Sequence[str], replies: list[Any]) -> list[Any]:
    """A pipeline's replies (run with ``raise_on_error=False``), one per key: a WRONGTYPE
    refusal is ``UnreadableIndex`` of its key; another error is raised."""
    for key, reply in zip(keys, replies, strict=True):
        if is_wrongtype(reply):
            raise UnreadableIndex(key)
        if isinstance(reply, Exception):
            raise reply
    return replies


def keeper_lease_key(queue: str) -> str:
    """The lease of the keeper acting for ``queue``: ``plaita:keeper:lease`` for the default queue
    (the key of before), ``plaita:keeper:lease:{<queue>}`` for any other (the queue's name as the
    hash tag, so on a cluster a queue's keeper keys share a slot, whatever the name holds)."""
    return KEEPER_LEASE_KEY if queue == DEFAULT.queue else f"{KEEPER_LEASE_KEY}:{{{queue}}}"


def strict_json(doc: dict[str, Any]) -> str:
    """``doc`` as strict JSON; one stored before JSON was strict (NaN in its state) loses its
    state, results and params rather than being written back with NaN."""
    try:
        return json.dumps(doc, ensure_ascii=False, allow_nan=False)
    except ValueError:
        return json.dumps({**doc, "state": {}, "results": {}, "params": {}}, ensure_ascii=False, allow_nan=False)


class KeeperAccess:
    """The keeper's calls on the executions of one client (bytes replies) and ``keyspace``."""

    client: redis.Redis
    ks: Keyspace

    def interrupt(self) -> None:
        """Cut calls in progress (best effort; they fail with ConnectionError) so a stop is
        not held up by a frozen server."""
        interrupt(self.client)

    @property
    def tenant(self) -> str:
        """This store's tenant id ("" for the default tenant), as the keeper names it."""
        return self.ks.tenant

    @property
    def keeper_lease_key(self) -> str:
        """The keeper lease of this store's queue."""
        return keeper_lease_key(self.ks.queue)

    def hold_keeper_lease(self, holder: str, ttl_ms: int) -> bool:
        return int(HOLD_KEEPER_LEASE(self.client, [self.keeper_lease_key], [holder, ttl_ms])) == 1

    def keeper_lease_holder(self) -> str | None:
        raw = self.client.get(self.keeper_lease_key)
        return None if raw is None else reply_text(raw)

    def release_keeper_lease(self, holder: str) -> None:
        """Hand the keeper role over at once (compare-and-delete: only our own lease)."""
        RELEASE_KEEPER_LEASE(self.client, [self.keeper_lease_key], [holder])

    def tenants(self) -> list[str]:
        """Every tenant (but the default one) with executions: ``ExecutionStore``'s."""
        raise NotImplementedError

    def keeper_tenants(self) -> list[str]:
        """``tenants()``; UnreadableIndex when the tenants set is not a set."""
        with index_of(TENANTS_KEY):
            return self.tenants()

    def due_deadlines(self, now_s: float, rearm_at_s: float, limit: int, *, dry_run: bool) -> list[str]:
        """Suspended executions past their deadline (re-armed to ``rearm_at_s`` unless dry run),
        at most ``limit`` over all partitions."""
        out: list[str] = []
        for p in range(len(self.ks.tags)):
            left, key = limit - len(out), self.ks.deadlines_key(p)
            if left <= 0:
                break
            with index_of(key):
                if dry_run:
                    raw = self.client.zrangebyscore(key, "-inf", repr(now_s), start=0, num=left)
                else:
                    raw = CLAIM_DEADLINES(self.client, [key], [repr(now_s), repr(rearm_at_s), left])
            out += [reply_text(m) for m in cast(list[Any], raw)]
        return out

    def unclaim_deadlines(self, execution_ids: Sequence[str], rearm_at_s: float, due_at_s: float) -> int:
        """Move the deadlines ``due_deadlines`` re-armed to ``rearm_at_s`` to ``due_at_s`` (those
        not re-armed since): due again (a wake not sent), or after the cooldown (one sent); how
        many were moved."""
        by_partition: dict[int, list[str]] = {}
        for eid in execution_ids:
            by_partition.setdefault(self.ks.partition_of(eid), []).append(eid)
        taken = 0
        for p, ids in by_partition.items():
            key = self.ks.deadlines_key(p)
            with index_of(key):
                taken += int(UNCLAIM_DEADLINES(self.client, [key], [repr(rearm_at_s), repr(due_at_s), *ids]))
        return taken

    def earliest_deadline(self) -> float | None:
        """The earliest suspension deadline over all partitions (epoch seconds), or None."""
        pipe = self.client.pipeline(transaction=False)
        keys = [self.ks.deadlines_key(p) for p in range(len(self.ks.tags))]
        for key in keys:
            pipe.zrange(key, 0, 0, withscores=True)
        scores = [float(rows[0][1]) for rows in _replies(keys, pipe.execute(raise_on_error=False)) if rows]
        return min(scores, default=None)

    def running_since(self, before_s: float, offset: int, limit: int) -> list[tuple[str, float]]:
        """Running executions last updated before ``before_s``, oldest first: (id, updated_at)."""
        rows: list[tuple[str, float]] = []
        width = len(self.ks.tags)
        for p in range(width):
            key = self.ks.status_key(p, "running")
            with index_of(key):
                raw = self.client.zrangebyscore(
                    key,
                    "-inf",
                    repr(before_s),
                    start=offset if width == 1 else 0,
                    num=limit if width == 1 else offset + limit,
                    withscores=True,
                )
            rows += [(reply_text(m), float(score)) for m, score in cast(list[Any], raw)]
        rows.sort(key=lambda r: r[1])
        return rows if width == 1 else rows[offset : offset + limit]

    def forget_deadline(self, execution_id: str) -> None:
        self.client.zrem(self.ks.deadlines_key(self.ks.partition_of(execution_id)), execution_id)

    def leased(self, execution_ids: Sequence[str]) -> list[bool]:
        pipe = self.client.pipeline(transaction=False)
        for e in execution_ids:
            pipe.exists(self.ks.lease_key(e))
        return [int(n) == 1 for n in pipe.execute()]

    def still_running(self, execution_ids: Sequence[str]) -> list[float | None]:
        """Current update time of each execution that is still running (None = not running)."""
        pipe = self.client.pipeline(transaction=False)
        keys = [self.ks.status_key(self.ks.partition_of(e), "running") for e in execution_ids]
        for key, e in zip(keys, execution_ids, strict=True):
            pipe.zscore(key, e)
        return [None if s is None else float(s) for s in _replies(keys, pipe.execute(raise_on_error=False))]

    def mark_retry_sent(self, execution_id: str, cooldown_s: int) -> bool:
        """True if no recovery retry was sent for this execution within the cooldown."""
        key = self.ks.named(KEEPER_RETRY_PREFIX) + key_id(execution_id)
        return bool(self.client.set(key, "1", nx=True, ex=max(1, cooldown_s)))

    def clear_retry_mark(self, execution_id: str) -> None:
        self.client.delete(self.ks.named(KEEPER_RETRY_PREFIX) + key_id(execution_id))

    def mark_orphaned(
        self,
        execution_id: str,
        updated_at_s: float,
        error_doc: dict[str, Any],
        now_s: float,
        retention_s: int,
        *,
        follow_up: Callable[[dict[str, Any]], dict[str, Any] | None] | None = None,
    ) -> bool:
        """Set a running, unleased execution not updated since ``updated_at_s`` to ``error``.

        WATCH makes it a compare-and-set: a worker that takes the lease or checkpoints in
        between wins, and nothing is written. ``follow_up(doc)`` (the ended document) may name
        a task body to enqueue on the execution's own stream in the same transaction (the
        stream carries the execution's hash tag): what follows the end is then never lost.
        """
        ks, p = self.ks, self.ks.partition_of(execution_id)
        key, lease, running = ks.execution_key(execution_id), ks.lease_key(execution_id), ks.status_key(p, "running")
        with self.client.pipeline(transaction=True) as pipe:
            try:
                pipe.watch(key, lease, running)  # type: ignore[no-untyped-call]
                doc = checked(execution_id, key, self._get_or_error(pipe, key))
                score = pipe.zscore(running, execution_id)
                if not isinstance(doc, dict) or doc.get("status") != "running":
                    return False  # an unreadable key is left as it is for an operator to repair
                if pipe.exists(lease) or score != updated_at_s:
                    return False
                doc.update(status="error", error=error_doc, updated_at=now_s, ended_at=now_s)
                body = follow_up(doc) if follow_up is not None else None
                pipe.multi()
                self._queue_orphaned(pipe, execution_id, doc, now_s, retention_s, body)
                pipe.execute()
                return True
            except redis.WatchError:
                return False

    def _queue_orphaned(
        self, pipe: Any, execution_id: str, doc: dict[str, Any], now_s: float, retention_s: int, body: Any
    ) -> None:
        """The writes of ``mark_orphaned``, queued in its transaction: the ended document, the
        status indexes, the events' expiry and the follow-up task ``body`` (None: no task)."""
        ks, p = self.ks, self.ks.partition_of(execution_id)
        pipe.set(ks.execution_key(execution_id), strict_json(doc), ex=retention_s)
        pipe.zrem(ks.status_key(p, "running"), execution_id)
        pipe.zadd(ks.status_key(p, "error"), {execution_id: now_s})
        pipe.expire(ks.events_key(execution_id), retention_s)  # what it published goes with it
        if body is not None:
            pipe.xadd(ks.stream(p), {PAYLOAD_FIELD: encode_body(body), SCHEMA_FIELD: "1"})

    @staticmethod
    def _get_or_error(pipe: Any, key: str) -> Any:
        """GET in a WATCHed pipeline (immediate mode), a WRONGTYPE refusal returned, not raised."""
        try:
            return pipe.get(key)
        except redis.ResponseError as exc:
            if is_wrongtype(exc):
                return exc
            raise
