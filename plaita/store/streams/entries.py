"""What a stream read yields, and what the DLQ is asked to keep: the data types of
``plaita.store.streams.queue``, and the parsing of raw XREADGROUP replies."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from plaita.errors import PlaitaError
from plaita.store.errors import error_code
from plaita.tasks import PAYLOAD_FIELD, SCHEMA_FIELD, decode_fields, field_name_bytes


def _raw_reply(response: Any, **_options: Any) -> Any:
    return response


def raw_fields(fields: dict[str, bytes]) -> dict[bytes, bytes]:
    """``fields`` with the exact bytes of each name again (names are decoded losslessly by
    ``decode_fields``, so one bad field name never breaks a read)."""
    return {field_name_bytes(k): v for k, v in fields.items()}


def as_text(value: bytes | str) -> str:
    """Bytes from Redis as text (lossy where not UTF-8: for ids, names and messages only)."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


class ReplicationLagError(PlaitaError):
    """A durable enqueue's entries reached fewer replicas than asked within the timeout."""

    def __init__(self, ids: list[str], acked: int, wanted: int) -> None:
        super().__init__(f"{len(ids)} task(s) added, but only {acked} of {wanted} replica(s) confirmed them in time")
        self.ids, self.acked, self.wanted = ids, acked, wanted


@dataclass(slots=True)
class Entry:
    """A raw stream entry as read from Redis; ``fields`` is None when it was deleted. Treat it
    as immutable: it is not frozen only because a frozen dataclass costs 1 µs more to build, per
    task read."""

    message_id: str
    fields: dict[str, bytes] | None
    delivery_count: int = 1
    #: What ``decode_fields`` found wrong with the raw fields (non-UTF-8 or duplicated names):
    #: any of them makes the entry a bad task.
    problems: tuple[str, ...] = ()
    #: Claimed from another consumer (``StreamQueue.claim_unleased``): how long that consumer had
    #: not talked to Redis, in ms (None: not claimed, or unknown).
    owner_idle_ms: int | None = None


@dataclass(frozen=True)
class DeadLetter:
    """A request to move a pending entry to the DLQ."""

    message_id: str
    reason: str
    delivery_count: int
    payload: Any  # the original body (dict) when it parsed, else None
    #: The entry's fields, kept whole in the envelope (every field, bytes exact); None if unknown.
    fields: dict[str, bytes] | None = None


def parse_read(reply: Any) -> list[Entry]:
    """Entries from a raw XREADGROUP reply (RESP2 list or RESP3 map; flat field lists).

    The read client skips redis-py's reply callback (``_raw_reply``): building its dicts
    costs more per entry than the rest of the read.
    """
    if not reply:
        return []
    streams = reply.values() if isinstance(reply, dict) else (items for _name, items in reply)
    entries: list[Entry] = []
    for items in streams:
        for message_id, flat in items:
            mid = message_id.decode("utf-8", "replace") if type(message_id) is bytes else as_text(message_id)
            if not flat:
                entries.append(Entry(mid, None))
                continue
            if isinstance(flat, dict):  # a client with redis-py's callback (tests' shared client)
                flat = [x for kv in flat.items() for x in kv]
            elif (
                len(flat) == 4
                and flat[0] == b"payload"
                and flat[2] == b"schema_version"
                and type(flat[1]) is bytes
                and type(flat[3]) is bytes
            ):  # what every producer writes: ``decode_fields``'s own fast path, without its call
                entries.append(Entry(mid, {PAYLOAD_FIELD: flat[1], SCHEMA_FIELD: flat[3]}))
                continue
            fields, problems = decode_fields(flat)
            entries.append(Entry(mid, fields, 1, tuple(problems)))
    return entries


def refused_dead_letters(results: list[Any], dead: list[DeadLetter]) -> list[tuple[DeadLetter, str]]:
    """The dead letters (the first ``len(dead)`` results) a key refused; any other error raises."""
    refused = []
    for i, result in enumerate(results):
        if not isinstance(result, Exception):
            continue
        if i < len(dead) and _is_per_key(result):
            refused.append((dead[i], f"{type(result).__name__}: {result}"))
        else:
            raise result
    return refused


def _is_per_key(exc: Exception) -> bool:
    """An error that one key caused (it holds another type), not a failure of Redis itself."""
    # Errors raised inside a script keep the reply code of the command that failed (Redis >= 7).
    return error_code(exc) == "WRONGTYPE"
