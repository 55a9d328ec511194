"""What the executions tab shows of composed flows: an execution's parent, its children (paged),
what a suspended one waits for (a durable sleep, children, a resume), and the schedules.

Reads only. A parent's document names its spawns (``children``: joins per step, and
``suspension.children`` while it waits), and child ``i`` of a spawn is ``{prefix}:{i}``
(docs/flows.md, "Child executions"), so a page of children is one pipelined GET of its ids: no
index, no SCAN, at most ``CHILD_ROWS + 1`` keys per page, whatever the number of children.
The schedules come from ``plaita.flows.schedule_listing.schedule_rows``, what ``plaita schedules list``
prints.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from plaita.flows.schedule_listing import schedule_rows
from plaita.store.executions.store import ExecutionStore, UnreadableExecution

#: Children listed per page.
CHILD_ROWS = 50
#: Spawns an execution page lists at most (a ``goto`` loop may spawn again and again).
MAX_SPAWNS = 50
#: What a suspended execution waits for, as the list's filter names it.
WAITING_KINDS = ("sleep", "children", "resume")


@dataclass(frozen=True)
class SpawnRef:
    """One ``ctx.spawn`` of an execution: its step, which join of that step, its children's prefix."""

    step: str
    join: int
    prefix: str
    #: Known while the parent waits on it (else read from a child's ``parent`` link).
    count: int | None = None
    waiting: bool = False
    flow_id: str | None = None


@dataclass
class ChildPage:
    """Children ``offset ..`` of one spawn."""

    spawn: SpawnRef
    offset: int
    rows: list[dict[str, Any]] = field(default_factory=list)
    count: int | None = None
    more: bool = False
    by_status: dict[str, int] = field(default_factory=dict)


def parent_of(doc: dict[str, Any]) -> dict[str, Any] | None:
    """The child's link to its parent (``id``, ``flow_id``, ``index``, ``count``), or None."""
    link = doc.get("parent")
    if not isinstance(link, dict) or not isinstance(link.get("id"), str) or not link["id"]:
        return None
    return {"id": link["id"], "flow_id": link.get("flow_id"), "index": link.get("index"), "count": link.get("count")}


def waiting_for(doc: dict[str, Any]) -> dict[str, Any] | None:
    """What a suspended execution waits for: ``kind`` (sleep, children or resume), ``step``,
    ``since``, ``until`` (its deadline: the wake of a sleep, the timeout of a suspend), ``count``
    (children); None unless suspended."""
    suspension = doc.get("suspension")
    if doc.get("status") != "suspended" or not isinstance(suspension, dict):
        return None
    children = suspension.get("children")
    if suspension.get("kind") == "sleep":
        kind = "sleep"
    elif isinstance(children, dict):
        kind = "children"
    else:
        kind = "resume"
    return {
        "kind": kind,
        "step": suspension.get("step"),
        "since": _number(suspension.get("since")),
        "until": _number(suspension.get("deadline")),
        "count": _int(children.get("count")) if isinstance(children, dict) else None,
        "flow_id": children.get("flow_id") if isinstance(children, dict) else None,
    }


def spawns(doc: dict[str, Any]) -> tuple[list[SpawnRef], int]:
    """The execution's spawns (the one it waits on first, then each step's, newest join first),
    at most ``MAX_SPAWNS``; and how many it has in all."""
    eid = str(doc.get("execution_id"))
    out: list[SpawnRef] = []
    waiting = waiting_for(doc)
    suspension = doc.get("suspension") or {}
    if waiting and waiting["kind"] == "children" and isinstance(suspension.get("children", {}).get("prefix"), str):
        prefix = suspension["children"]["prefix"]
        join = _int(prefix.rsplit(":", 1)[-1]) or 0
        out.append(SpawnRef(str(waiting["step"]), join, prefix, waiting["count"], True, waiting["flow_id"]))
    joins = doc.get("children")
    total = len(out)
    for step, n in sorted(joins.items()) if isinstance(joins, dict) else []:
        rounds = max(0, _int(n) or 0)
        total += rounds
        for k in range(rounds - 1, max(-1, rounds - 1 - MAX_SPAWNS), -1):
            out.append(SpawnRef(str(step), k, f"{eid}:{step}:{k}"))
    return out[:MAX_SPAWNS], total


def children(store: ExecutionStore, spawn: SpawnRef, offset: int, limit: int = CHILD_ROWS) -> ChildPage:
    """Children ``offset .. offset+limit-1`` of ``spawn``, and whether there are more. Ids run
    from 0 without gaps, so with the count unknown the first missing id ends the list."""
    page = ChildPage(spawn, offset, count=spawn.count)
    stop = offset + limit + 1 if spawn.count is None else min(spawn.count, offset + limit)
    ids = [f"{spawn.prefix}:{i}" for i in range(offset, stop)]
    for i, (eid, doc) in enumerate(zip(ids, store.read_many(ids), strict=True)):
        if i == limit:  # the probe past the page
            page.more = doc is not None
            break
        if doc is None and spawn.count is None:
            break
        page.rows.append(_child_row(offset + i, eid, doc))
        if page.count is None and isinstance(doc, dict):
            page.count = _int((parent_of(doc) or {}).get("count"))
    if spawn.count is not None:
        page.more = offset + limit < spawn.count
    page.by_status = dict(Counter(r["status"] for r in page.rows))
    return page


def _child_row(index: int, eid: str, doc: dict[str, Any] | None | UnreadableExecution) -> dict[str, Any]:
    row: dict[str, Any] = {"index": index, "execution_id": eid, "flow_id": None, "step": None, "updated_at": None}
    if isinstance(doc, UnreadableExecution):
        return {**row, "status": "unreadable", "note": str(doc)}
    if doc is None:
        return {**row, "status": "not started", "note": "no document (yet, or expired)"}
    error = doc.get("error")
    note = f"{error.get('type')}: {error.get('message')}" if isinstance(error, dict) else ""
    return {
        **row,
        "status": str(doc.get("status")),
        "flow_id": doc.get("flow_id"),
        "step": doc.get("step"),
        "updated_at": _number(doc.get("updated_at")),
        "note": note[:200],
    }


def page_of(doc: dict[str, Any], wanted: str) -> tuple[list[SpawnRef], int, SpawnRef | None]:
    """(spawns, how many in all, the one to list): ``wanted`` (a prefix) when it is one of the
    execution's, else the first. Only the execution's own prefixes are ever read."""
    found, total = spawns(doc)
    chosen = next((s for s in found if s.prefix == wanted), found[0] if found else None)
    return found, total, chosen


def view(store: ExecutionStore, doc: dict[str, Any], wanted: str, offset: int) -> dict[str, Any]:
    """Everything the execution page shows of composition (one more round trip for children)."""
    found, total, chosen = page_of(doc, wanted)
    return {
        "parent": parent_of(doc),
        "waiting": waiting_for(doc),
        "spawns": found,
        "spawns_total": total,
        "children": children(store, chosen, max(0, offset)) if chosen else None,
        "scheduled": _scheduled(doc),
    }


def waits_as(doc: dict[str, Any], kind: str) -> bool:
    """The executions list's filter: ``doc`` is suspended waiting for ``kind``."""
    waiting = waiting_for(doc)
    return waiting is not None and waiting["kind"] == kind


def schedules(store: ExecutionStore) -> list[dict[str, Any]]:
    """Every schedule a keeper recorded, as ``plaita schedules list`` shows it (without
    ``--flows``: the dashboard loads no flow module)."""
    return schedule_rows([], store, time.time())


def _scheduled(doc: dict[str, Any]) -> dict[str, Any] | None:
    params = doc.get("params")
    tick = params.get("scheduled") if isinstance(params, dict) else None
    return tick if isinstance(tick, dict) else None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        return None
