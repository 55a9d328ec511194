"""Operator access to the dead-letter stream: list, show, requeue, purge (``plaita dlq``)."""

from __future__ import annotations

import collections
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from plaita.envelope import original_fields
from plaita.store.keyspace import LEVEL_SUFFIX, PRIORITY_MAX, level_stream
from plaita.store.streams.entries import as_text
from plaita.store.streams.queue import StreamQueue
from plaita.tasks import PAYLOAD_FIELD, SCHEMA_FIELD, encode_body


def _replay_fields(row: dict[str, Any]) -> dict[Any, Any]:
    """The fields to put back on the stream: the original entry's exact bytes when the envelope
    kept them (and nothing was truncated), else the body, as an envelope without ``fields`` stored it."""
    try:
        return dict(original_fields(row))
    except ValueError:
        pass
    body = row.get("payload")
    payload = encode_body(body) if isinstance(body, dict) else str(body if body is not None else "")
    return {PAYLOAD_FIELD: payload, SCHEMA_FIELD: "1"}


#: Dead letters read per XRANGE call while scanning.
SCAN_CHUNK = 200


@dataclass
class DlqScan:
    """What one bounded scan looked at: the matching rows and the range of ids it covered."""

    rows: list[dict[str, Any]]
    scanned: int
    first_id: str | None  # the first dlq id looked at
    last_id: str | None  # the last one: continue after it
    more: bool  # dead letters beyond ``last_id`` (within ``until``) remain


def _position(part_and_id: tuple[int, str]) -> tuple[int, int, int]:
    """(ms, seq, partition) of an unqualified dlq id; ValueError when it is no stream id."""
    p, mid = part_and_id
    ms, sep, seq = mid.partition("-")
    if not (ms.isdigit() and sep and seq.isdigit()):
        raise ValueError(f"not a dead letter id: {mid!r}")
    return int(ms), int(seq), p


def _low(p: int, start: tuple[int, int, int] | None) -> str:
    """XRANGE start in partition ``p`` for entries ordered after ``start`` by (id, partition)."""
    if start is None:
        return "-"
    ms, seq, sp = start
    return f"{ms}-{seq}" if p > sp else f"({ms}-{seq}"


def _high(p: int, stop: tuple[int, int, int] | None) -> str:
    """XRANGE end in partition ``p`` for entries ordered up to ``stop`` (inclusive)."""
    if stop is None:
        return "+"
    ms, seq, sp = stop
    return f"{ms}-{seq}" if p <= sp else f"({ms}-{seq}"


def _id_pair(mid: str) -> tuple[int, int]:
    ms, _, seq = mid.partition("-")
    return (int(ms), int(seq or 0)) if ms.isdigit() and (seq or "0").isdigit() else (0, 0)


class DeadLetterQueue:
    """Operator access to the DLQ stream(s): list, show, requeue, purge (``plaita dlq``).

    A partitioned queue has one DLQ per partition (in its hash slot); ids are then qualified
    like message ids, ``<partition>/<dlq id>``, and a requeue goes back onto its own partition.
    """

    def __init__(self, queue: StreamQueue) -> None:
        self.queue = queue
        self.client = queue.client
        self.parts = queue.partition_queues()
        self.ks = queue.keyspace

    def _row(self, p: int, message_id: Any, fields: dict[Any, Any]) -> dict[str, Any]:
        raw = fields.get(PAYLOAD_FIELD.encode()) or fields.get(PAYLOAD_FIELD)
        text = as_text(raw) if raw is not None else ""
        try:
            envelope = json.loads(text)
        except ValueError:
            envelope = {"reason": "unreadable DLQ envelope", "payload": text}
        if not isinstance(envelope, dict):
            envelope = {"reason": "unreadable DLQ envelope", "payload": envelope}
        # The id last: an envelope's own "dlq_id" field must not stand in for the entry's id.
        return {**envelope, "dlq_id": self.ks.qualify(p, as_text(message_id))}

    def _range(self, p: int, low: str = "-", high: str = "+", count: int | None = None) -> list[tuple[Any, Any]]:
        rows = self.client.xrange(self.parts[p].dlq_key, min=low, max=high, count=count)
        return cast(list[tuple[Any, Any]], rows or [])

    def oldest(self, count: int) -> list[dict[str, Any]]:
        """The oldest ``count`` dead letters (of every partition, oldest first by id time)."""
        rows = [self._row(p, mid, f) for p in range(len(self.parts)) for mid, f in self._range(p, count=count)]
        rows.sort(key=lambda r: _id_order(r["dlq_id"]))
        return rows[:count]

    def scan(
        self,
        match: Callable[[dict[str, Any]], bool] | None = None,
        *,
        after: str | None = None,
        until: str | None = None,
        max_rows: int,
        max_scan: int,
    ) -> DlqScan:
        """Dead letters after ``after`` (a dlq id; None: from the oldest) up to ``until``
        (inclusive; None: the newest), oldest first across partitions, looking at no more than
        ``max_scan`` of them and stopping at ``max_rows`` matches. Reads in chunks: a request
        costs about ``max_scan / SCAN_CHUNK`` XRANGE calls per partition, whatever the DLQ holds.
        ValueError when ``after`` or ``until`` is not a dlq id of this queue."""
        start = _position(self.ks.unqualify(after)) if after else None
        stop = _position(self.ks.unqualify(until)) if until else None
        bufs: dict[int, collections.deque[tuple[Any, Any]]] = {}
        for p in range(len(self.parts)):
            bufs[p] = collections.deque(self._chunk(p, _low(p, start), _high(p, stop)))
        found = DlqScan([], 0, None, None, False)
        while found.scanned < max_scan and len(found.rows) < max_rows:
            live = [p for p in bufs if bufs[p]]
            if not live:
                break
            p = min(live, key=lambda q: (*_id_pair(as_text(bufs[q][0][0])), q))
            mid, fields = bufs[p].popleft()
            if not bufs[p]:  # refill now, so that an empty buffer means an exhausted partition
                bufs[p].extend(self._chunk(p, "(" + as_text(mid), _high(p, stop)))
            row = self._row(p, mid, fields)
            found.scanned += 1
            found.first_id = found.first_id or row["dlq_id"]
            found.last_id = row["dlq_id"]
            if match is None or match(row):
                found.rows.append(row)
        found.more = any(bufs.values())
        return found

    def _chunk(self, p: int, low: str, high: str) -> list[tuple[Any, Any]]:
        return self._range(p, low, high, SCAN_CHUNK)

    def get(self, dlq_id: str) -> dict[str, Any] | None:
        try:
            p, mid = self.ks.unqualify(dlq_id)
        except ValueError:
            return None
        rows = self._range(p, mid, mid, 1)
        return self._row(p, *rows[0]) if rows else None

    def requeue(self, dlq_ids: list[str]) -> list[tuple[str, str]]:
        """Put dead letters back on the queue as new entries (delivery count starts again),
        keeping their body, and remove them from the DLQ. A body goes to the partition it belongs
        to (so a misrouted task is routed now): in one transaction with the removal when that is
        its DLQ's own partition, else added first and removed after (at worst twice, never lost).
        Returns (dlq id, new message id) pairs; unknown ids raise KeyError."""
        groups: dict[tuple[int, int], list[tuple[str, dict[str, Any]]]] = {}
        for dlq_id in dlq_ids:
            row = self.get(dlq_id)
            if row is None:
                raise KeyError(dlq_id)
            source, mid = self.ks.unqualify(dlq_id)
            body = row.get("payload")
            target = self.queue.partition_for(body) if isinstance(body, dict) else source
            groups.setdefault((source, target), []).append((mid, row))
        moved: list[tuple[str, str]] = []
        for (source, target), rows in groups.items():
            new_ids = self._move(source, target, rows)
            moved += [
                (row["dlq_id"], self.ks.qualify(target, new)) for (_, row), new in zip(rows, new_ids, strict=True)
            ]
        return moved

    def _move(self, source: int, target: int, rows: list[tuple[str, dict[str, Any]]]) -> list[str]:
        """The new ids, each as its partition names it (``<L>/<id>`` on a priority level)."""
        same_slot = source == target
        pipe = self.client.pipeline(transaction=same_slot)
        levels = [self._replay_level(source, target, row) for _, row in rows]
        for (_, row), level in zip(rows, levels, strict=True):
            pipe.xadd(self.parts[target].stream_for(level), _replay_fields(row))
        if not same_slot:
            new_ids = pipe.execute()
            pipe = self.client.pipeline(transaction=False)
        pipe.xdel(self.parts[source].dlq_key, *(mid for mid, _ in rows))
        results = pipe.execute()
        added = new_ids if not same_slot else results[: len(rows)]
        return [f"{lv}/{as_text(mid)}" if lv else as_text(mid) for lv, mid in zip(levels, added, strict=True)]

    def _replay_level(self, source: int, target: int, row: dict[str, Any]) -> int:
        """The priority level a dead letter goes back to: the one it was read from (its envelope's
        ``source_stream``), 0 when none or when the queue has no levels (a plain StreamQueue)."""
        came_from = str(row.get("source_stream") or "")
        _, sep, tail = came_from.rpartition(LEVEL_SUFFIX)
        level = int(tail) if sep and tail.isdigit() and 1 <= int(tail) <= PRIORITY_MAX else 0
        if level == 0 or came_from != level_stream(self.parts[source].stream, level):
            return 0
        try:
            self.parts[target].stream_for(level)
        except ValueError:
            return 0
        return level

    def all_ids(self) -> list[str]:
        return [self.ks.qualify(p, as_text(mid)) for p in range(len(self.parts)) for mid, _ in self._range(p)]

    def length(self) -> int:
        return sum(int(self.client.xlen(part.dlq_key)) for part in self.parts)

    def purge(self) -> int:
        """Delete every dead letter; returns how many there were."""
        total = 0
        for part in self.parts:
            pipe = self.client.pipeline(transaction=True)
            pipe.xlen(part.dlq_key)
            pipe.delete(part.dlq_key)
            count, _ = pipe.execute()
            total += int(count)
        return total


def _id_order(dlq_id: str) -> tuple[int, int]:
    ms, _, seq = dlq_id.rpartition("/")[2].partition("-")
    return (int(ms), int(seq or 0)) if ms.isdigit() and (seq or "0").isdigit() else (0, 0)
