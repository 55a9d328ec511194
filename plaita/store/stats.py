"""Queue statistics for operators: stream length, pending, lag, oldest pending age, DLQ length,
delayed tasks not due yet (``plaita.store.streams.delayed``); and the executions per status of
every tenant (``execution_counts``)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

import redis

from plaita.store.client import is_cluster
from plaita.store.errors import error_code
from plaita.store.executions.store import ExecutionStore
from plaita.store.keyspace import LEVEL_SUFFIX, Keyspace
from plaita.store.streams.delayed import delayed_key
from plaita.store.streams.entries import as_text
from plaita.store.streams.queue import StreamQueue

#: Tenants ``execution_counts`` counts at most (one ZCARD per status and partition each); the
#: rest are only counted, so a deployment with thousands of tenants still answers at once.
MAX_TENANTS_COUNTED = 50

#: Counters summed over partitions.
_SUMMED = ("length", "pending", "dlq_length")


def stream_stats(q: StreamQueue) -> dict[str, Any]:
    """Stream length, group pending/lag and DLQ length (raises on Redis errors), summed over
    the partitions of a partitioned queue (each partition's own row under ``partitions``)."""
    return _merged(q, [_with_levels(part, _one_stream_stats) for part in q.partition_queues()])


def _with_levels(part: StreamQueue, one: Callable[[StreamQueue], dict[str, Any]]) -> dict[str, Any]:
    """``one``'s row of a partition, its priority levels' streams counted in (``length``,
    ``pending``, ``lag``, ``delayed``; each level's length under ``levels``, by level). They share
    its DLQ."""
    queues = part.level_queues()
    rows = [one(q) for q in queues]
    if len(rows) == 1:
        return rows[0]
    out = dict(rows[0])
    out["length"] = sum(int(r["length"]) for r in rows)
    out["pending"] = sum(int(r["pending"]) for r in rows)
    lags, delayed = [r["lag"] for r in rows], [r["delayed"] for r in rows]
    out["lag"] = None if any(lag is None for lag in lags) else sum(int(lag) for lag in lags)
    out["delayed"] = None if any(n is None for n in delayed) else sum(int(n) for n in delayed)
    oldest = max(rows, key=lambda r: float(r["oldest_pending_age_s"]))
    out["oldest_pending_id"], out["oldest_pending_age_s"] = oldest["oldest_pending_id"], oldest["oldest_pending_age_s"]
    out["levels"] = {str(_level_of(part, q)): int(r["length"]) for q, r in zip(queues, rows, strict=True)}
    return out


def _level_of(part: StreamQueue, q: StreamQueue) -> int:
    """The priority level of ``q``, one of ``part.level_queues()``: its stream's ``:prio<L>``."""
    return 0 if q is part else int(q.stream.rsplit(LEVEL_SUFFIX, 1)[1])


def _merged(q: StreamQueue, rows: list[dict[str, Any]]) -> dict[str, Any]:
    if len(rows) == 1:
        return rows[0]
    out = dict(rows[0], stream=q.stream)
    for key in _SUMMED:
        out[key] = sum(int(r[key]) for r in rows)
    delayed = [r["delayed"] for r in rows]
    out["delayed"] = None if any(n is None for n in delayed) else sum(int(n) for n in delayed)
    lags = [r["lag"] for r in rows]
    out["lag"] = None if any(lag is None for lag in lags) else sum(int(lag) for lag in lags)
    out["consumers"] = max(int(r["consumers"]) for r in rows)
    oldest = max(rows, key=lambda r: float(r["oldest_pending_age_s"]))
    out["oldest_pending_id"] = oldest["oldest_pending_id"]
    out["oldest_pending_age_s"] = oldest["oldest_pending_age_s"]
    notes = sorted({str(r["note"]) for r in rows if "note" in r})
    out.pop("note", None)
    if notes:
        out["note"] = "; ".join(notes)
    if any("levels" in r for r in rows):  # a partition without levels has its length at level 0
        levels: dict[str, int] = {}
        for r in rows:
            for level, n in r.get("levels", {"0": int(r["length"])}).items():
                levels[level] = levels.get(level, 0) + n
        out["levels"] = dict(sorted(levels.items()))
    out["partitions"] = rows
    return out


def _one_stream_stats(q: StreamQueue) -> dict[str, Any]:
    pipe = q.client.pipeline(transaction=False)
    pipe.xlen(q.stream)
    pipe.xlen(q.dlq_key)
    pipe.xinfo_groups(q.stream)
    pipe.xpending(q.stream, q.group)
    pipe.zcard(delayed_key(q.stream))
    *replies, delayed = pipe.execute(raise_on_error=False)
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    length, dlq_length, groups, summary = replies
    oldest = summary.get("min") if isinstance(summary, dict) else None
    oldest_age_s = 0.0
    if oldest:
        oldest_ms = int(as_text(oldest).split("-", 1)[0])
        oldest_age_s = max(0.0, time.time() - oldest_ms / 1000)
    group: dict[str, Any] = next((g for g in groups if as_text(g.get("name", b"")) == q.group), {})
    return {
        "stream": q.stream,
        "group": q.group,
        "length": int(length),
        "pending": int(group.get("pending", 0) or 0),
        "lag": group.get("lag"),
        "consumers": int(group.get("consumers", 0) or 0),
        "dlq_length": int(dlq_length),
        "delayed": _count_or_none(delayed),
        "oldest_pending_id": as_text(oldest) if oldest else None,
        "oldest_pending_age_s": round(oldest_age_s, 3),
    }


def _count_or_none(reply: Any) -> int | None:
    """A ZCARD reply; None when the user may not run it (an ACL from before delayed tasks)."""
    if isinstance(reply, Exception):
        if error_code(reply) != "NOPERM":
            raise reply
        return None
    return int(reply)


def _delayed_or_none(q: StreamQueue) -> int | None:
    try:
        return int(q.client.zcard(delayed_key(q.stream)))
    except redis.ResponseError as exc:
        return _count_or_none(exc)


def is_settled(q: StreamQueue) -> bool:
    """True when every stream is empty and nothing is pending (every ack reached Redis)."""
    return all(_one_settled(level) for part in q.partition_queues() for level in part.level_queues())


def _one_settled(q: StreamQueue) -> bool:
    pipe = q.client.pipeline(transaction=False)
    pipe.xlen(q.stream)
    pipe.xpending(q.stream, q.group)
    length, pending = pipe.execute()
    return int(length) == 0 and int(pending.get("pending", 0) or 0) == 0


def stream_stats_or_empty(q: StreamQueue) -> dict[str, Any]:
    """``stream_stats``, or zeros with a note when the stream or its group does not exist yet."""
    return _merged(q, [_with_levels(part, _one_or_empty) for part in q.partition_queues()])


def _one_or_empty(q: StreamQueue) -> dict[str, Any]:
    try:
        return _one_stream_stats(q)
    except redis.ResponseError as exc:
        if "no such key" not in str(exc) and "NOGROUP" not in str(exc):
            raise
    exists = bool(q.client.exists(q.stream))
    groups = q.client.xinfo_groups(q.stream) if exists else []
    group = next((g for g in groups if as_text(g.get("name", b"")) == q.group), None)
    return {
        "stream": q.stream,
        "group": q.group,
        "length": int(q.client.xlen(q.stream)) if exists else 0,
        "pending": int(group.get("pending", 0) or 0) if group else 0,
        "lag": group.get("lag") if group else None,
        "consumers": int(group.get("consumers", 0) or 0) if group else 0,
        "dlq_length": int(q.client.xlen(q.dlq_key)),
        "delayed": _delayed_or_none(q),
        "oldest_pending_id": None,
        "oldest_pending_age_s": 0.0,
        "note": "stream does not exist yet" if not exists else f"group {q.group!r} does not exist yet",
    }


#: SCAN calls one stray-stream search makes at most (COUNT 1000 each): bounded on a huge keyspace.
STRAY_SCAN_CALLS = 200
_PARTITION_STREAM = re.compile(r"\{p\d+(\.\d+)?\}")


def stray_streams(client: redis.Redis, ks: Keyspace) -> tuple[dict[str, int], bool]:
    """Non-empty streams of queue ``ks.queue`` that a worker with ``ks.partitions`` partitions
    never reads (a producer or worker with another ``--partitions``): {stream: length}, and
    whether the whole keyspace was searched (False: the SCAN budget ran out first)."""
    ours = {ks.stream(p) for p in range(ks.partitions)}
    candidates: set[str] = set() if ks.queue in ours else {ks.queue}
    prefix = f"{ks.queue}:"
    pattern = glob_escape(prefix) + "{p*"
    keys: list[Any] = []
    complete = False
    if is_cluster(client):  # every master's keys (its own SCAN per node)
        keys, complete = list(client.scan_iter(match=pattern, count=1000, _type="stream")), True
    else:
        cursor: Any = 0
        for _ in range(STRAY_SCAN_CALLS):
            cursor, page = client.scan(cursor=cursor, match=pattern, count=1000, _type="stream")
            keys += page
            if not int(cursor):
                complete = True
                break
    for key in keys:
        name = as_text(key)
        if _PARTITION_STREAM.fullmatch(name[len(prefix) :]):
            candidates.add(name)
    found: dict[str, int] = {}
    for name in sorted(candidates - ours):
        try:
            length = int(client.xlen(name))
        except redis.ResponseError:  # another type under that name: not a stream of ours
            continue
        if length:
            found[name] = length
    return found, complete


def glob_escape(text: str) -> str:
    """``text`` as a literal in a SCAN MATCH pattern."""
    return re.sub(r"([\\*?\[\]])", r"\\\1", text)


def execution_counts(client: Any, keyspace: Keyspace, max_tenants: int = MAX_TENANTS_COUNTED) -> dict[str, Any]:
    """Executions per status: the default tenant's (``default``), each tenant's in
    ``plaita:tenants`` by name (``tenants``, the first ``max_tenants`` sorted) and how many
    tenants were left out (``tenants_more``)."""
    store = ExecutionStore(client, keyspace)
    tenants = store.tenants()
    return {
        "default": store.counts(),
        "tenants": {t: store.for_tenant(t).counts() for t in tenants[:max_tenants]},
        "tenants_more": max(0, len(tenants) - max_tenants),
    }
