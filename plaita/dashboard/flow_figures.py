"""The overview's per-flow figures: starts, running, waiting by kind, completions and failures per
minute, p50/p95 duration, starts waiting for a slot.

Read from the status index that exists anyway, so a start costs nothing more: every
``FIGURES_EVERY_S`` the sampler reads the newest ``READ_PER_STATUS`` executions of each status of
the default tenant (ZREVRANGE per partition, then the states as pipelined GETs, ``READ_PAGE`` a
round trip) and groups them by flow.
What is counted:

- running, queued and waiting (by kind: sleep, children, resume): every execution in that status
  read, so exact while a status holds at most ``READ_PER_STATUS`` (else a lower bound, marked);
- started, completed and failed per minute: executions created, completed or ended ``error`` in
  the last ``WINDOW_S`` (the index is scored by last update, so each is among the newest read;
  a lower bound, marked, once a status took more than ``READ_PER_STATUS`` updates in the window);
- p50/p95: ``ended_at - created_at`` of the completed executions read (the newest
  ``READ_PER_STATUS``), nearest rank;
- waiting for a slot: the limited flows' start queues (``waiting_starts``), exact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from plaita.dashboard.lineage import WAITING_KINDS, waiting_for
from plaita.store.executions.store import ALL_STATUSES, ExecutionStore

#: Seconds between two reads of the per-flow figures (each reads up to 6 x READ_PER_STATUS states).
FIGURES_EVERY_S = 5.0
#: Newest executions read per status per round: the bound on the figures' cost.
READ_PER_STATUS = 300
#: States read per round trip (a page's worth: one reply stays small even when states are large).
READ_PAGE = 100
#: The span of the per-minute figures.
WINDOW_S = 60.0


@dataclass
class FlowFigures:
    """One flow's row on the overview."""

    flow_id: str
    started: int = 0
    queued: int = 0
    running: int = 0
    waiting: dict[str, int] = field(default_factory=lambda: dict.fromkeys(WAITING_KINDS, 0))
    waiting_slot: int = 0
    completed: int = 0
    failed: int = 0
    durations_s: list[float] = field(default_factory=list)

    def row(self) -> dict[str, Any]:
        ordered = sorted(self.durations_s)
        return {
            "flow_id": self.flow_id,
            "started": self.started,
            "queued": self.queued,
            "running": self.running,
            "waiting": dict(self.waiting),
            "waiting_slot": self.waiting_slot,
            "completed": self.completed,
            "failed": self.failed,
            "p50_s": percentile(ordered, 50),
            "p95_s": percentile(ordered, 95),
            "durations": len(ordered),
        }


def percentile(ordered: list[float], pct: float) -> float | None:
    """The nearest-rank ``pct`` percentile of ``ordered`` (sorted), None when empty."""
    if not ordered:
        return None
    rank = max(1, math.ceil(pct / 100.0 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def read(store: ExecutionStore, starts_waiting: dict[str, int], now_s: float) -> dict[str, Any]:
    """The figures of every flow seen: ``flows`` (rows sorted by flow id), ``capped`` (the statuses
    holding more than were read: their counts are lower bounds)."""
    held = store.counts()  # one ZCARD per status: how far to read, and whether that was all
    docs: dict[str, list[dict[str, Any]]] = {}
    for status in ALL_STATUSES:
        docs[status] = found = []
        wanted = min(held.get(status, 0), READ_PER_STATUS)
        for offset in range(0, wanted, READ_PAGE):
            found.extend(store.by_status(status, min(READ_PAGE, wanted - offset), offset=offset))
    capped = sorted(s for s in ALL_STATUSES if held.get(s, 0) > READ_PER_STATUS)
    return {**tally(docs, starts_waiting, now_s), "capped": capped}


def tally(docs: dict[str, list[dict[str, Any]]], starts_waiting: dict[str, int], now_s: float) -> dict[str, Any]:
    """``read``'s grouping, given the documents read per status (newest first); ``capped`` is
    ``read``'s to fill."""
    flows: dict[str, FlowFigures] = {}

    def of(doc: dict[str, Any]) -> FlowFigures:
        flow_id = str(doc.get("flow_id") or "?")
        return flows.setdefault(flow_id, FlowFigures(flow_id))

    since_s = now_s - WINDOW_S
    for status, found in docs.items():
        for doc in found:
            figures = of(doc)
            if _number(doc.get("created_at")) >= since_s:
                figures.started += 1
            _count(figures, status, doc, since_s)
    for flow_id, n in starts_waiting.items():
        if n:
            flows.setdefault(flow_id, FlowFigures(flow_id)).waiting_slot = n
    return {"flows": [flows[f].row() for f in sorted(flows)], "capped": [], "window_s": WINDOW_S}


def _count(figures: FlowFigures, status: str, doc: dict[str, Any], since_s: float) -> None:
    if status == "running":
        figures.running += 1
    elif status == "queued":
        figures.queued += 1
    elif status == "suspended":
        wait = waiting_for(doc)
        if wait is not None:
            figures.waiting[wait["kind"]] += 1
    elif status == "completed":
        created, ended = _number(doc.get("created_at")), _number(doc.get("ended_at"))
        if created > 0 and ended >= created:
            figures.durations_s.append(ended - created)
        figures.completed += int(ended >= since_s)
    elif status == "error":
        figures.failed += int(_number(doc.get("ended_at") or doc.get("updated_at")) >= since_s)


def _number(value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return 0.0
    return number if number == number else 0.0  # NaN counts as never


__all__ = ["FIGURES_EVERY_S", "READ_PER_STATUS", "WINDOW_S", "FlowFigures", "percentile", "read", "tally"]
