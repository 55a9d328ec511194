"""Operator access to the dead-letter stream: list, show, requeue, purge (``plaita dlq``)."""

from __future__ import annotations

import json
from typing import Any, cast

from plaita.envelope import original_fields
from plaita.store.entries import as_text
from plaita.store.streams import StreamQueue
from plaita.tasks import PAYLOAD_FIELD, SCHEMA_FIELD, encode_body


def _replay_fields(row: dict[str, Any]) -> dict[Any, Any]:
    """The fields to put back on the stream: the original entry's exact bytes when the envelope
    kept them (and nothing was truncated), else the body as the anchor's envelopes stored it."""
    try:
        return dict(original_fields(row))
    except ValueError:
        pass
    body = row.get("payload")
    payload = encode_body(body) if isinstance(body, dict) else str(body if body is not None else "")
    return {PAYLOAD_FIELD: payload, SCHEMA_FIELD: "1"}


class DeadLetterQueue:
    """Operator access to the DLQ stream: list, show, requeue, purge (``plaita dlq``)."""

    def __init__(self, queue: StreamQueue) -> None:
        self.queue = queue
        self.client = queue.client

    @staticmethod
    def _row(message_id: Any, fields: dict[Any, Any]) -> dict[str, Any]:
        raw = fields.get(PAYLOAD_FIELD.encode()) or fields.get(PAYLOAD_FIELD)
        text = as_text(raw) if raw is not None else ""
        try:
            envelope = json.loads(text)
        except ValueError:
            envelope = {"reason": "unreadable DLQ envelope", "payload": text}
        if not isinstance(envelope, dict):
            envelope = {"reason": "unreadable DLQ envelope", "payload": envelope}
        return {"dlq_id": as_text(message_id), **envelope}

    def _range(self, low: str = "-", high: str = "+", count: int | None = None) -> list[tuple[Any, dict[Any, Any]]]:
        rows = self.client.xrange(self.queue.dlq_key, min=low, max=high, count=count)
        return cast(list[tuple[Any, dict[Any, Any]]], rows or [])

    def oldest(self, count: int) -> list[dict[str, Any]]:
        """The oldest ``count`` dead letters."""
        return [self._row(mid, f) for mid, f in self._range(count=count)]

    def get(self, dlq_id: str) -> dict[str, Any] | None:
        rows = self._range(dlq_id, dlq_id, 1)
        return self._row(*rows[0]) if rows else None

    def requeue(self, dlq_ids: list[str]) -> list[tuple[str, str]]:
        """Put dead letters back on the stream as new entries (delivery count starts again),
        keeping their body, and remove them from the DLQ, in one transaction.
        Returns (dlq id, new stream id) pairs; unknown ids raise KeyError."""
        rows = []
        for dlq_id in dlq_ids:
            row = self.get(dlq_id)
            if row is None:
                raise KeyError(dlq_id)
            rows.append(row)
        pipe = self.client.pipeline(transaction=True)
        for row in rows:
            pipe.xadd(self.queue.stream, _replay_fields(row))
        pipe.xdel(self.queue.dlq_key, *dlq_ids)
        results = pipe.execute()
        return [(row["dlq_id"], as_text(new_id)) for row, new_id in zip(rows, results[:-1], strict=True)]

    def all_ids(self) -> list[str]:
        return [as_text(mid) for mid, _ in self._range()]

    def length(self) -> int:
        return int(self.client.xlen(self.queue.dlq_key))

    def purge(self) -> int:
        """Delete every dead letter; returns how many there were."""
        pipe = self.client.pipeline(transaction=True)
        pipe.xlen(self.queue.dlq_key)
        pipe.delete(self.queue.dlq_key)
        count, _ = pipe.execute()
        return int(count)
