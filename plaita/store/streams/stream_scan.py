"""What the keeper reads from the streams: the execution ids of every task still queued or
pending, so it never retries an execution whose task is only waiting."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any, cast

import redis

from plaita.tasks import DEFAULT_TENANT, PAYLOAD_FIELD


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def stream_execution_ids(
    client: redis.Redis, streams: Sequence[str], max_entries: int, page: int = 500
) -> tuple[set[str], bool]:
    """Execution ids of every task still in ``streams`` (queued or pending: acked entries are
    deleted), and whether every stream was read within ``max_entries`` entries each. A tenant's
    task is named ``<tenant>/<id>`` (its body's ``tenant_id``), the default tenant's ``<id>``."""
    seen: set[str] = set()
    for stream in streams:
        ids, complete = _stream_ids(client, stream, max_entries, page)
        seen |= ids
        if not complete:
            return seen, False
    return seen, True


def _stream_ids(client: redis.Redis, stream: str, max_entries: int, page: int) -> tuple[set[str], bool]:
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
    eid = value if isinstance(value, str) and value else _text(message_id)
    tenant = body.get("tenant_id")
    # A default id that looks like ``t/x`` only makes tenant t's x look queued: a later retry, never a double.
    return (f"{tenant}/{eid}",) if isinstance(tenant, str) and tenant not in ("", DEFAULT_TENANT) else (eid,)


def start_queued(
    client: redis.Redis, stream: str, execution_id: str, tenant: str, max_entries: int, page: int = 1000
) -> bool | None:
    """Whether a start of ``execution_id`` (of ``tenant``, "" the default one) is in ``stream``:
    queued, handed back to wait for a flow slot, or read and not acked yet (acked entries are
    deleted). None when it was not among the first ``max_entries`` entries and there are more."""
    start, left = "-", max_entries
    while left > 0:
        batch = cast(list[Any], client.xrange(stream, min=start, max="+", count=min(page, left)))
        if any(_is_start_of(fields, execution_id, tenant) for _, fields in batch):
            return True
        if len(batch) < min(page, left):  # the end of the stream
            return False
        left -= len(batch)
        start = "(" + _text(batch[-1][0])
    return None if client.xrange(stream, min=start, max="+", count=1) else False


def _is_start_of(fields: dict[Any, Any], execution_id: str, tenant: str) -> bool:
    raw = fields.get(PAYLOAD_FIELD.encode()) or fields.get(PAYLOAD_FIELD)
    try:
        body = json.loads(raw) if raw is not None else None
    except ValueError:
        return False
    if not isinstance(body, dict) or body.get("type") != "start" or body.get("execution_id") != execution_id:
        return False
    theirs = body.get("tenant_id")
    return (theirs if isinstance(theirs, str) and theirs != DEFAULT_TENANT else "") == tenant
