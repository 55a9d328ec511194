"""The DLQ page and "requeue all matching": a bounded, resumable search of the whole DLQ.

Each request looks at no more than ``SCAN_ENTRIES`` dead letters (oldest first, in chunks)
and lists at most ``PAGE_ROWS`` matches; the page says which range of ids it looked at and
offers to continue after the last one. "Requeue all matching" re-runs the same search over the
same range (``after``..``until``, the ids the page showed) and says what it moved and what is
left beyond it. Rows are shown through ``display``: a DLQ entry is whatever some writer put
there (no payload, a payload that is not JSON, a reason that is a list, binary junk), and
every shape renders.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from plaita.dashboard.actions import STREAM_ID, ActionError, Outcome, requeue
from plaita.store.streams.dlq import DeadLetterQueue, DlqScan

#: Matching dead letters listed on one page (and requeued by one "requeue all matching").
PAGE_ROWS = 100
#: Dead letters looked at by one request at most, whatever the DLQ holds.
SCAN_ENTRIES = 1000
#: Characters of a payload shown in the table.
PAYLOAD_CHARS = 160


@dataclass
class DlqPage:
    rows: list[dict[str, Any]]
    scan: DlqScan
    after: str  # where this page started ("" = the oldest)


def matcher(needle: str) -> Callable[[dict[str, Any]], bool] | None:
    """Reason or payload contains ``needle``, case-insensitively (None: everything matches)."""
    if not needle:
        return None
    low = needle.lower()
    return lambda row: low in _text(row.get("reason")).lower() or low in _text(row.get("payload")).lower()


def cursor(text: str) -> str | None:
    """A dlq id given as ``after``/``until`` (None when empty); ActionError when it is not one."""
    if not text:
        return None
    if not STREAM_ID.fullmatch(text):
        raise ActionError(f"{text[:60]!r} is not a DLQ id to continue from (like 1717171717171-0)")
    return text


def _scan(dlq: DeadLetterQueue, needle: str, after: str, until: str = "") -> DlqScan:
    try:
        return dlq.scan(
            matcher(needle), after=cursor(after), until=cursor(until), max_rows=PAGE_ROWS, max_scan=SCAN_ENTRIES
        )
    except ValueError as exc:  # a well-formed id of another partition count, say
        raise ActionError(f"{exc} (for this queue's DLQ)") from None


def page(dlq: DeadLetterQueue, needle: str, after: str) -> DlqPage:
    scan = _scan(dlq, needle, after)
    return DlqPage([display(r) for r in scan.rows], scan, after)


def requeue_matching(dlq: DeadLetterQueue, needle: str, after: str, until: str) -> Outcome:
    """Requeue what the page showed as matching: the same search over the same range."""
    scan = _scan(dlq, needle, after, until)
    what = f"matching {needle!r}" if needle else "listed"
    if not scan.rows:
        raise ActionError(f"no dead letter {what} between {after or 'the oldest'} and {until or 'the newest'}")
    done = requeue(dlq, [r["dlq_id"] for r in scan.rows])
    beyond = scan.more or dlq.scan(after=scan.last_id, max_rows=1, max_scan=1).scanned > 0
    tail = f"; more beyond {scan.last_id}: continue on the DLQ page" if beyond else ""
    return Outcome(
        f"{done.message} ({what}, of {scan.scanned} looked at from {scan.first_id} to {scan.last_id}{tail})", []
    )


def display(row: dict[str, Any]) -> dict[str, Any]:
    """The fields the table shows, each a plain string or number whatever the envelope held."""
    return {
        "dlq_id": str(row.get("dlq_id", "")),
        "source_id": _text(row.get("source_id"))[:60],
        "delivery_count": _count(row.get("delivery_count")),
        "dead_lettered_at": _epoch(row.get("dead_lettered_at")),
        "reason": _text(row.get("reason")) or "(no reason given)",
        "payload": _text(row.get("payload"))[:PAYLOAD_CHARS] if "payload" in row else "(no payload)",
    }


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
    except (TypeError, ValueError):
        return str(value)


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _epoch(value: Any) -> float | None:
    """A plausible Unix time (1970..9999) or None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and 0 <= value < 253402300800 else None
