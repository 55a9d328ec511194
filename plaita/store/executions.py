"""Every Redis access of flow executions: state, fenced checkpoints, the status index, cancel
flags, start dedup, suspension deadlines, and what the keeper reads.

Keys (compatible with the original plaita):

- ``plaita:execution:{id}``: the execution's state, one JSON string.
- ``plaita:execution:cancel:{id}``: cancel intent (any value), 7 days.
- ``plaita:start-dedup:{key}``: the execution id a dedup key started, 7 days.
- ``plaita:executions:status:{status}``: one sorted set per status, member = execution id,
  score = last update (epoch seconds), so listing by status needs neither KEYS nor SCAN.
- ``plaita:executions:deadlines``: suspended executions with a deadline, scored by it.

A checkpoint is one EVALSHA: the lease generation is checked inside Lua (a worker that lost
its lease can never overwrite its successor), then the state, the status index, the deadline
and the step's staged writes are written together. Every key a script touches is in KEYS.
"""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import redis

from plaita.store import scripts
from plaita.store.leases import fence_key, lease_key
from plaita.tasks import PAYLOAD_FIELD

#: Execution state key prefix.
EXECUTION_PREFIX = "plaita:execution:"
CANCEL_PREFIX = "plaita:execution:cancel:"
DEDUP_PREFIX = "plaita:start-dedup:"
STATUS_PREFIX = "plaita:executions:status:"
DEADLINES_KEY = "plaita:executions:deadlines"
#: Set by the keeper when it enqueued a recovery ``retry``: one per cooldown per execution.
KEEPER_RETRY_PREFIX = "plaita:execution:keeper-retry:"
KEEPER_LEASE_KEY = "plaita:keeper:lease"
#: Statuses, in the order the checkpoint script receives their index keys.
STATUSES = ("running", "suspended", "completed", "error", "cancelled")
TERMINAL = frozenset({"completed", "error", "cancelled"})
#: Cancel flags and dedup keys outlive any execution that could still use them.
FLAG_TTL_S = 7 * 24 * 3600
#: Staged write operations a step may queue.
STAGE_OPS = frozenset({"set", "incrby", "rpush"})


CHECKPOINT = scripts.script("checkpoint_execution")
CREATE = scripts.script("create_execution")
CLAIM_DEADLINES = scripts.script("claim_deadlines")
HOLD_KEEPER_LEASE = scripts.script("hold_keeper_lease")
RELEASE_KEEPER_LEASE = scripts.script("release_keeper_lease")


def execution_key(execution_id: str) -> str:
    return f"{EXECUTION_PREFIX}{execution_id}"


def cancel_key(execution_id: str) -> str:
    return f"{CANCEL_PREFIX}{execution_id}"


def dedup_key(key: str) -> str:
    return f"{DEDUP_PREFIX}{key}"


def status_key(status: str) -> str:
    return f"{STATUS_PREFIX}{status}"


@dataclass(frozen=True)
class Staged:
    """One write a step queued to commit with its checkpoint."""

    op: str
    key: str
    value: str
    ttl_s: int = 0


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _decode(raw: Any) -> dict[str, Any] | None:
    if raw is None:
        return None
    doc = json.loads(raw)
    return doc if isinstance(doc, dict) else None


class ExecutionStore:
    """Execution state on one Redis client (bytes replies)."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client

    # -- the worker's path ---------------------------------------------------------------
    def load(self, execution_id: str) -> tuple[dict[str, Any] | None, bool]:
        """(state or None, cancel requested) in one round trip."""
        raw, flag = cast(list[Any], self.client.mget([execution_key(execution_id), cancel_key(execution_id)]))
        return _decode(raw), flag is not None

    def create(
        self, execution_id: str, generation: int, state_json: str, now_s: float, dedup: str | None
    ) -> tuple[int, str, bool]:
        """Create the state under the lease: (code, text, cancel requested); see CREATE."""
        keys = [
            lease_key(execution_id),
            fence_key(execution_id),
            execution_key(execution_id),
            status_key("running"),
            cancel_key(execution_id),
        ]
        if dedup:
            keys.append(dedup_key(dedup))
        args = [generation, state_json, repr(now_s), execution_id, FLAG_TTL_S]
        code, text, cancel = CREATE(self.client, keys, args)
        return int(code), _text(text), int(cancel) == 1

    def checkpoint(
        self,
        execution_id: str,
        generation: int,
        state_json: str,
        *,
        status: str,
        now_s: float,
        deadline_s: float | None = None,
        retention_s: int = 0,
        staged: Sequence[Staged] = (),
    ) -> tuple[bool, bool]:
        """One fenced write of the state, index, deadline and staged writes: (written, cancel requested)."""
        keys = [
            lease_key(execution_id),
            fence_key(execution_id),
            execution_key(execution_id),
            cancel_key(execution_id),
            DEADLINES_KEY,
            *(status_key(s) for s in STATUSES),
            *(s.key for s in staged),
        ]
        args: list[Any] = [
            generation,
            state_json,
            STATUSES.index(status) + 1,
            repr(now_s),
            execution_id,
            "" if deadline_s is None else repr(deadline_s),
            retention_s if status in TERMINAL else 0,
            len(staged),
        ]
        for s in staged:
            args.extend((s.op, s.value, s.ttl_s))
        ok, cancel = CHECKPOINT(self.client, keys, args)
        return int(ok) == 1, int(cancel) == 1

    def cancel_requested_many(self, execution_ids: Sequence[str]) -> list[bool]:
        if not execution_ids:
            return []
        return [v is not None for v in cast(list[Any], self.client.mget([cancel_key(e) for e in execution_ids]))]

    # -- producers and operators ---------------------------------------------------------
    def get(self, execution_id: str) -> dict[str, Any] | None:
        return _decode(self.client.get(execution_key(execution_id)))

    def request_cancel(self, execution_id: str) -> None:
        self.client.set(cancel_key(execution_id), "1", ex=FLAG_TTL_S)

    def dedup_target(self, key: str) -> str | None:
        raw = self.client.get(dedup_key(key))
        return None if raw is None else _text(raw)

    def by_status(self, status: str, limit: int, *, offset: int = 0, prune: bool = True) -> list[dict[str, Any]]:
        """The most recently updated executions with ``status``, skipping the newest ``offset``
        (index entries whose state has expired are dropped from the index on the way, unless
        ``prune`` is false: a read-only user may not write)."""
        first = max(0, offset)
        raw_ids = self.client.zrevrange(status_key(status), first, first + max(0, limit - 1))
        ids = [_text(m) for m in cast(list[Any], raw_ids)]
        if not ids:
            return []
        raws = cast(list[Any], self.client.mget([execution_key(e) for e in ids]))
        gone = [e for e, raw in zip(ids, raws, strict=True) if raw is None]
        if gone and prune:
            self.client.zrem(status_key(status), *gone)
        return [doc for doc in (_decode(r) for r in raws) if doc is not None]

    def counts(self) -> dict[str, int]:
        pipe = self.client.pipeline(transaction=False)
        for s in STATUSES:
            pipe.zcard(status_key(s))
        return {s: int(n) for s, n in zip(STATUSES, pipe.execute(), strict=True)}

    # -- the keeper ----------------------------------------------------------------------
    def interrupt(self) -> None:
        """Cut calls in progress (best effort; they fail with ConnectionError) so a stop is
        not held up by a frozen server."""
        for conn in list(getattr(self.client.connection_pool, "_in_use_connections", ())):
            sock = getattr(conn, "_sock", None)
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def hold_keeper_lease(self, holder: str, ttl_ms: int) -> bool:
        return int(HOLD_KEEPER_LEASE(self.client, [KEEPER_LEASE_KEY], [holder, ttl_ms])) == 1

    def release_keeper_lease(self, holder: str) -> None:
        """Hand the keeper role over at once (compare-and-delete: only our own lease)."""
        RELEASE_KEEPER_LEASE(self.client, [KEEPER_LEASE_KEY], [holder])

    def due_deadlines(self, now_s: float, rearm_at_s: float, limit: int, *, dry_run: bool) -> list[str]:
        """Suspended executions past their deadline (re-armed to ``rearm_at_s`` unless dry run)."""
        if dry_run:
            raw = self.client.zrangebyscore(DEADLINES_KEY, "-inf", repr(now_s), start=0, num=limit)
        else:
            raw = CLAIM_DEADLINES(self.client, [DEADLINES_KEY], [repr(now_s), repr(rearm_at_s), limit])
        return [_text(m) for m in cast(list[Any], raw)]

    def running_since(self, before_s: float, offset: int, limit: int) -> list[tuple[str, float]]:
        """Running executions last updated before ``before_s``, oldest first: (id, updated_at)."""
        raw = self.client.zrangebyscore(
            status_key("running"), "-inf", repr(before_s), start=offset, num=limit, withscores=True
        )
        return [(_text(m), float(score)) for m, score in cast(list[Any], raw)]

    def forget_deadline(self, execution_id: str) -> None:
        self.client.zrem(DEADLINES_KEY, execution_id)

    def leased(self, execution_ids: Sequence[str]) -> list[bool]:
        pipe = self.client.pipeline(transaction=False)
        for e in execution_ids:
            pipe.exists(lease_key(e))
        return [int(n) == 1 for n in pipe.execute()]

    def still_running(self, execution_ids: Sequence[str]) -> list[float | None]:
        """Current update time of each execution that is still running (None = not running)."""
        pipe = self.client.pipeline(transaction=False)
        for e in execution_ids:
            pipe.zscore(status_key("running"), e)
        return [None if s is None else float(s) for s in pipe.execute()]

    def mark_retry_sent(self, execution_id: str, cooldown_s: int) -> bool:
        """True if no recovery retry was sent for this execution within the cooldown."""
        return bool(self.client.set(f"{KEEPER_RETRY_PREFIX}{execution_id}", "1", nx=True, ex=max(1, cooldown_s)))

    def mark_orphaned(
        self, execution_id: str, updated_at_s: float, error_doc: dict[str, Any], now_s: float, retention_s: int
    ) -> bool:
        """Set a running, unleased execution not updated since ``updated_at_s`` to ``error``.

        WATCH makes it a compare-and-set: a worker that takes the lease or checkpoints in
        between wins, and nothing is written.
        """
        key, lease = execution_key(execution_id), lease_key(execution_id)
        with self.client.pipeline(transaction=True) as pipe:
            try:
                pipe.watch(key, lease, status_key("running"))  # type: ignore[no-untyped-call]
                doc = _decode(pipe.get(key))
                score = pipe.zscore(status_key("running"), execution_id)
                if doc is None or doc.get("status") != "running" or pipe.exists(lease) or score != updated_at_s:
                    return False
                doc.update(status="error", error=error_doc, updated_at=now_s, ended_at=now_s)
                pipe.multi()
                pipe.set(key, json.dumps(doc, ensure_ascii=False), ex=retention_s)
                pipe.zrem(status_key("running"), execution_id)
                pipe.zadd(status_key("error"), {execution_id: now_s})
                pipe.execute()
                return True
            except redis.WatchError:
                return False


def stream_execution_ids(client: redis.Redis, stream: str, max_entries: int, page: int = 500) -> tuple[set[str], bool]:
    """Execution ids of every task still in ``stream`` (queued or pending: acked entries are
    deleted), and whether the whole stream was read within ``max_entries``."""
    seen: set[str] = set()
    start, read = "-", 0
    while read < max_entries:
        batch = cast(list[Any], client.xrange(stream, min=start, max="+", count=page))
        if not batch:
            return seen, True
        for message_id, fields in batch:
            seen.update(_ids_in(message_id, fields))
        read += len(batch)
        if len(batch) < page:
            return seen, True
        start = "(" + _text(batch[-1][0])
    return seen, False


def _ids_in(message_id: Any, fields: dict[Any, Any]) -> Iterable[str]:
    raw = fields.get(PAYLOAD_FIELD.encode()) or fields.get(PAYLOAD_FIELD)
    try:
        body = json.loads(raw) if raw is not None else None
    except ValueError:
        return ()
    if not isinstance(body, dict):
        return ()
    value = body.get("execution_id")
    return (value,) if isinstance(value, str) and value else (_text(message_id),)
