"""Queue statistics for operators: stream length, pending, lag, oldest pending age, DLQ length."""

from __future__ import annotations

import time
from typing import Any

import redis

from plaita.store.entries import as_text
from plaita.store.streams import StreamQueue


def stream_stats(q: StreamQueue) -> dict[str, Any]:
    """Stream length, group pending/lag and DLQ length (raises on Redis errors)."""
    pipe = q.client.pipeline(transaction=False)
    pipe.xlen(q.stream)
    pipe.xlen(q.dlq_key)
    pipe.xinfo_groups(q.stream)
    pipe.xpending(q.stream, q.group)
    length, dlq_length, groups, summary = pipe.execute()
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
        "oldest_pending_id": as_text(oldest) if oldest else None,
        "oldest_pending_age_s": round(oldest_age_s, 3),
    }


def is_settled(q: StreamQueue) -> bool:
    """True when the stream is empty and nothing is pending (every ack reached Redis)."""
    pipe = q.client.pipeline(transaction=False)
    pipe.xlen(q.stream)
    pipe.xpending(q.stream, q.group)
    length, pending = pipe.execute()
    return int(length) == 0 and int(pending.get("pending", 0) or 0) == 0


def stream_stats_or_empty(q: StreamQueue) -> dict[str, Any]:
    """``stream_stats``, or zeros with a note when the stream or its group does not exist yet."""
    try:
        return stream_stats(q)
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
        "oldest_pending_id": None,
        "oldest_pending_age_s": 0.0,
        "note": "stream does not exist yet" if not exists else f"group {q.group!r} does not exist yet",
    }
