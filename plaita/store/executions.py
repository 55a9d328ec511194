"""Every Redis access of flow executions: state, fenced checkpoints, the status index, cancel
flags, start dedup, suspension deadlines, and what the keeper reads.

Keys (the names existing deployments and tools read; they do not change):

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

import json
import math
from collections.abc import Sequence
from typing import Any, cast

import redis

from plaita.errors import BadTaskError
from plaita.store import scripts
from plaita.store.client import get_many, interrupt
from plaita.store.keyspace import (
    CANCEL_PREFIX,
    DEADLINES_KEY,
    DEDUP_PREFIX,
    DEFAULT,
    EXECUTION_PREFIX,
    STATUS_PREFIX,
    Keyspace,
)
from plaita.store.staged import STAGE_OPS, ExecutionKeyError, Staged, StagedWriteRefused
from plaita.store.staged import plan as plan_staged
from plaita.store.stream_scan import stream_execution_ids

__all__ = [
    "CANCEL_PREFIX",
    "DEADLINES_KEY",
    "DEDUP_PREFIX",
    "EXECUTION_PREFIX",
    "STAGE_OPS",
    "STATUS_PREFIX",
    "ExecutionKeyError",
    "ExecutionStore",
    "Staged",
    "StagedWriteRefused",
    "UnreadableExecution",
    "stream_execution_ids",
]
#: Set by the keeper when it enqueued a recovery ``retry``: one per cooldown per execution.
KEEPER_RETRY_PREFIX = "plaita:execution:keeper-retry:"
KEEPER_LEASE_KEY = "plaita:keeper:lease"
#: Statuses, in the order the checkpoint script receives their index keys.
STATUSES = ("running", "suspended", "completed", "error", "cancelled")
TERMINAL = frozenset({"completed", "error", "cancelled"})
#: Cancel flags and dedup keys outlive any execution that could still use them.
FLAG_TTL_S = 7 * 24 * 3600


CHECKPOINT = scripts.script("checkpoint_execution")
CREATE = scripts.script("create_execution")
CLAIM_DEADLINES = scripts.script("claim_deadlines")
HOLD_KEEPER_LEASE = scripts.script("hold_keeper_lease")
RELEASE_KEEPER_LEASE = scripts.script("release_keeper_lease")


def _checkpointed(reply: list[Any]) -> tuple[bool, bool]:
    """CHECKPOINT's reply as (written, cancel requested), or the refusal it names."""
    code = int(reply[0])
    if code == 2:
        raise StagedWriteRefused(_text(reply[1]), _text(reply[2]))
    if code == 3:
        raise ExecutionKeyError(_text(reply[1]), _text(reply[2]))
    return code == 1, code == 1 and int(reply[1]) == 1


def _strict_json(doc: dict[str, Any]) -> str:
    """``doc`` as strict JSON; one stored before JSON was strict (NaN in its state) loses its
    state, results and params rather than being written back with NaN."""
    try:
        return json.dumps(doc, ensure_ascii=False, allow_nan=False)
    except ValueError:
        return json.dumps({**doc, "state": {}, "results": {}, "params": {}}, ensure_ascii=False, allow_nan=False)


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class UnreadableExecution(BadTaskError):
    """An execution key that holds no execution: not JSON, JSON but not an object, or not a
    string key at all. Data, not an outage: readers skip it (and say so), never delete it; a
    task of that execution is a bad task (the DLQ, with this reason), not a failed delivery."""

    def __init__(self, execution_id: str, key: str, reason: str) -> None:
        super().__init__(f"execution {execution_id!r} is unreadable ({key} {reason})")
        self.execution_id, self.key, self.why = execution_id, key, reason


def _is_wrongtype(value: Any) -> bool:
    return isinstance(value, redis.ResponseError) and str(value).startswith("WRONGTYPE")


def _checked(execution_id: str, key: str, raw: Any) -> dict[str, Any] | None | UnreadableExecution:
    """The state in ``raw`` (a GET reply, or the error a pipeline returned for it)."""
    if _is_wrongtype(raw):
        return UnreadableExecution(execution_id, key, "is not a string key")
    if isinstance(raw, Exception):
        raise raw
    if raw is None:
        return None
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # ValueError covers bad UTF-8 too
        return UnreadableExecution(execution_id, key, f"is not JSON: {str(exc)[:80]}")
    if not isinstance(doc, dict):
        return UnreadableExecution(execution_id, key, f"is JSON but not an object ({type(doc).__name__})")
    return doc


class ExecutionStore:
    """Execution state on one Redis client (bytes replies), in one queue's ``keyspace``.

    With partitions each execution's keys carry its partition's hash tag; the per-status and
    deadline indexes are one per partition, and the listings here merge them.
    """

    def __init__(self, client: redis.Redis, keyspace: Keyspace = DEFAULT) -> None:
        self.client = client
        self.ks = keyspace

    # -- the worker's path ---------------------------------------------------------------
    def load(self, execution_id: str) -> tuple[dict[str, Any] | None, bool]:
        """(state or None, cancel requested) in one round trip."""
        key = self.ks.execution_key(execution_id)
        raw, flag = cast(list[Any], self.client.mget([key, self.ks.cancel_key(execution_id)]))
        return self.parse(execution_id, raw), flag is not None

    def parse(self, execution_id: str, raw: Any) -> dict[str, Any] | None:
        """The state in ``raw`` (a GET of the execution key); UnreadableExecution when it holds none."""
        doc = _checked(execution_id, self.ks.execution_key(execution_id), raw)
        if isinstance(doc, UnreadableExecution):
            raise doc
        return doc

    def create(
        self, execution_id: str, generation: int, state_json: str, now_s: float, dedup: str | None
    ) -> tuple[int, str, bool]:
        """Create the state under the lease: (code, text, cancel requested); see CREATE.
        ExecutionKeyError (nothing written) when one of its keys holds the wrong type."""
        ks, p = self.ks, self.ks.partition_of(execution_id)
        keys = [
            ks.lease_key(execution_id),
            ks.fence_key(execution_id),
            ks.execution_key(execution_id),
            ks.status_key(p, "running"),
            ks.cancel_key(execution_id),
        ]
        if dedup:
            keys.append(ks.dedup_key(p, dedup))
        args = [generation, state_json, repr(now_s), execution_id, FLAG_TTL_S]
        code, text, cancel = CREATE(self.client, keys, args)
        if int(code) == 4:
            raise ExecutionKeyError(_text(text), "holds the wrong type")
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
        """One fenced write of the state, index, deadline and staged writes: (written, cancel requested).

        All or nothing. StagedWriteRefused for a staged write Redis would refuse (checked here,
        or by the script against the key's current type and value), ExecutionKeyError for a
        wrong-typed index: in both cases nothing was written.
        """
        if deadline_s is not None and not math.isfinite(deadline_s):
            raise ValueError(f"checkpoint deadline must be a finite time, got {deadline_s!r}")
        ks, p = self.ks, self.ks.partition_of(execution_id)
        keys = [ks.lease_key(execution_id), ks.fence_key(execution_id), ks.execution_key(execution_id)]
        keys += [ks.cancel_key(execution_id), ks.deadlines_key(p), *(ks.status_key(p, s) for s in STATUSES)]
        keys += [s.key for s in staged]
        args: list[Any] = [
            generation,
            state_json,
            STATUSES.index(status) + 1,
            repr(now_s),
            execution_id,
            "" if deadline_s is None else repr(deadline_s),
            retention_s if status in TERMINAL else 0,
            len(staged),
            *plan_staged(staged),
        ]
        return _checkpointed(cast(list[Any], CHECKPOINT(self.client, keys, args)))

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
        return [_checked(e, k, raw) for e, k, raw in zip(execution_ids, keys, raws, strict=True)]

    def request_cancel(self, execution_id: str) -> None:
        self.client.set(self.ks.cancel_key(execution_id), "1", ex=FLAG_TTL_S)

    def dedup_target(self, key: str) -> str | None:
        """The execution a dedup key started. With partitions a dedup key lives in the partition
        its own text hashes to (``FlowClient.start`` picks execution ids there)."""
        raw = self.client.get(self.ks.dedup_key(self.ks.partition_of(key), key))
        return None if raw is None else _text(raw)

    def _index(self, status: str, first: int, last: int, *, newest: bool) -> list[tuple[int, str, float]]:
        """(partition, id, score) of ranks ``first..last`` of ``status`` over every partition."""
        rows: list[tuple[int, str, float]] = []
        for p in range(len(self.ks.tags)):
            key = self.ks.status_key(p, status)
            rng = self.client.zrevrange if newest else self.client.zrange
            raw = rng(key, 0 if len(self.ks.tags) > 1 else first, last, withscores=True)
            rows += [(p, _text(m), float(score)) for m, score in cast(list[Any], raw)]
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
        for s in STATUSES:
            for p in range(len(self.ks.tags)):
                pipe.zcard(self.ks.status_key(p, s))
        totals = [int(n) for n in pipe.execute()]
        width = len(self.ks.tags)
        return {s: sum(totals[i * width : (i + 1) * width]) for i, s in enumerate(STATUSES)}

    # -- the keeper ----------------------------------------------------------------------
    def interrupt(self) -> None:
        """Cut calls in progress (best effort; they fail with ConnectionError) so a stop is
        not held up by a frozen server."""
        interrupt(self.client)

    def hold_keeper_lease(self, holder: str, ttl_ms: int) -> bool:
        return int(HOLD_KEEPER_LEASE(self.client, [KEEPER_LEASE_KEY], [holder, ttl_ms])) == 1

    def keeper_lease_holder(self) -> str | None:
        raw = self.client.get(KEEPER_LEASE_KEY)
        return None if raw is None else _text(raw)

    def release_keeper_lease(self, holder: str) -> None:
        """Hand the keeper role over at once (compare-and-delete: only our own lease)."""
        RELEASE_KEEPER_LEASE(self.client, [KEEPER_LEASE_KEY], [holder])

    def due_deadlines(self, now_s: float, rearm_at_s: float, limit: int, *, dry_run: bool) -> list[str]:
        """Suspended executions past their deadline (re-armed to ``rearm_at_s`` unless dry run),
        at most ``limit`` over all partitions."""
        out: list[str] = []
        for p in range(len(self.ks.tags)):
            left, key = limit - len(out), self.ks.deadlines_key(p)
            if left <= 0:
                break
            if dry_run:
                raw = self.client.zrangebyscore(key, "-inf", repr(now_s), start=0, num=left)
            else:
                raw = CLAIM_DEADLINES(self.client, [key], [repr(now_s), repr(rearm_at_s), left])
            out += [_text(m) for m in cast(list[Any], raw)]
        return out

    def running_since(self, before_s: float, offset: int, limit: int) -> list[tuple[str, float]]:
        """Running executions last updated before ``before_s``, oldest first: (id, updated_at)."""
        rows: list[tuple[str, float]] = []
        width = len(self.ks.tags)
        for p in range(width):
            raw = self.client.zrangebyscore(
                self.ks.status_key(p, "running"),
                "-inf",
                repr(before_s),
                start=offset if width == 1 else 0,
                num=limit if width == 1 else offset + limit,
                withscores=True,
            )
            rows += [(_text(m), float(score)) for m, score in cast(list[Any], raw)]
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
        for e in execution_ids:
            pipe.zscore(self.ks.status_key(self.ks.partition_of(e), "running"), e)
        return [None if s is None else float(s) for s in pipe.execute()]

    def mark_retry_sent(self, execution_id: str, cooldown_s: int) -> bool:
        """True if no recovery retry was sent for this execution within the cooldown."""
        return bool(self.client.set(f"{KEEPER_RETRY_PREFIX}{execution_id}", "1", nx=True, ex=max(1, cooldown_s)))

    def clear_retry_mark(self, execution_id: str) -> None:
        self.client.delete(f"{KEEPER_RETRY_PREFIX}{execution_id}")

    def mark_orphaned(
        self, execution_id: str, updated_at_s: float, error_doc: dict[str, Any], now_s: float, retention_s: int
    ) -> bool:
        """Set a running, unleased execution not updated since ``updated_at_s`` to ``error``.

        WATCH makes it a compare-and-set: a worker that takes the lease or checkpoints in
        between wins, and nothing is written.
        """
        ks, p = self.ks, self.ks.partition_of(execution_id)
        key, lease, running = ks.execution_key(execution_id), ks.lease_key(execution_id), ks.status_key(p, "running")
        with self.client.pipeline(transaction=True) as pipe:
            try:
                pipe.watch(key, lease, running)  # type: ignore[no-untyped-call]
                doc = _checked(execution_id, key, self._get_or_error(pipe, key))
                score = pipe.zscore(running, execution_id)
                if not isinstance(doc, dict) or doc.get("status") != "running":
                    return False  # an unreadable key is left as it is for an operator to repair
                if pipe.exists(lease) or score != updated_at_s:
                    return False
                doc.update(status="error", error=error_doc, updated_at=now_s, ended_at=now_s)
                pipe.multi()
                pipe.set(key, _strict_json(doc), ex=retention_s)
                pipe.zrem(running, execution_id)
                pipe.zadd(ks.status_key(p, "error"), {execution_id: now_s})
                pipe.execute()
                return True
            except redis.WatchError:
                return False

    @staticmethod
    def _get_or_error(pipe: Any, key: str) -> Any:
        """GET in a WATCHed pipeline (immediate mode), a WRONGTYPE refusal returned, not raised."""
        try:
            return pipe.get(key)
        except redis.ResponseError as exc:
            if _is_wrongtype(exc):
                return exc
            raise
