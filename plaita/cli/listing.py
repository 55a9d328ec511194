"""What ``plaita executions list`` reads: the newest executions of each status, paged through
the status index as far as ``--limit`` needs (not just its first page), of one tenant or, with
``--all-tenants``, of the default tenant and every tenant with executions. Reads only."""

from __future__ import annotations

from typing import Any

#: Index entries read per call (one ZRANGE and one pipelined read of the documents).
PAGE = 200
#: Most rows ``--limit`` may ask for.
MAX_LIMIT = 100_000
#: Most index entries one status of one tenant is scanned for (``--flow`` keeps only some):
#: a bound on what one command reads from a server in production.
MAX_SCANNED = 200_000


def newest(
    stores: list[Any], statuses: tuple[str, ...] | list[str], *, flow: str | None, limit: int
) -> tuple[list[dict[str, Any]], list[Any], bool]:
    """(rows newest first, at most ``limit``; unreadable keys; True when a scan stopped at
    ``MAX_SCANNED`` before it found ``limit`` rows). Each row carries its ``tenant``."""
    rows: list[dict[str, Any]] = []
    bad: list[Any] = []
    capped = False
    for store in stores:
        tenant = store.ks.tenant or "default"
        totals = store.counts()
        for status in statuses:
            found, unreadable, stopped = _of_status(store, status, totals.get(status, 0), flow, limit)
            rows.extend({**doc, "tenant": tenant} for doc in found)
            bad.extend(unreadable)
            capped = capped or stopped
    rows.sort(key=lambda d: number_or_zero(d.get("updated_at")), reverse=True)
    return rows[:limit], bad, capped


def _of_status(
    store: Any, status: str, total: int, flow: str | None, limit: int
) -> tuple[list[dict[str, Any]], list[Any], bool]:
    """The newest ``limit`` rows of one status (of ``flow``), a page at a time."""
    found: list[dict[str, Any]] = []
    bad: list[Any] = []
    offset = 0
    while len(found) < limit and offset < total:
        if offset >= MAX_SCANNED:
            return found, bad, True
        size = PAGE if flow is not None else min(PAGE, limit - len(found))
        docs, unreadable = store.listing(status, size, offset=offset)
        found.extend(d for d in docs if flow in (None, d.get("flow_id")))
        bad.extend(unreadable)
        offset += size
    return found[:limit], bad, False


def number_or_zero(value: Any) -> float:
    """A timestamp field as a float; 0 for anything that is not a number (sorted last)."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0
