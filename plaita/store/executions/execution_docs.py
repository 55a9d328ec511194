"""Reading an execution key: its state, or why it holds none (``UnreadableExecution``)."""

from __future__ import annotations

import json
from typing import Any

import redis

from plaita.errors import BadTaskError


class UnreadableExecution(BadTaskError):
    """An execution key that holds no execution: not JSON, JSON but not an object, or not a
    string key at all. Data, not an outage: readers skip it (and say so), never delete it; a
    task of that execution is a bad task (the DLQ, with this reason), not a failed delivery."""

    def __init__(self, execution_id: str, key: str, reason: str) -> None:
        super().__init__(f"execution {execution_id!r} is unreadable ({key} {reason})")
        self.execution_id, self.key, self.why = execution_id, key, reason


def is_wrongtype(value: Any) -> bool:
    return isinstance(value, redis.ResponseError) and str(value).startswith("WRONGTYPE")


def checked(execution_id: str, key: str, raw: Any) -> dict[str, Any] | None | UnreadableExecution:
    """The state in ``raw`` (a GET reply, or the error a pipeline returned for it)."""
    if is_wrongtype(raw):
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


def reply_text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
