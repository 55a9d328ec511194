"""Listing executions and their steps as typed rows: ``FlowClient.list`` and ``FlowClient.steps``.

``list_executions`` pages through the status indexes newest update first
(``plaita.store.executions.index_scan``) of the tenants ``stores_of`` names; ``FlowClient.list``,
the CLI's ``executions list`` (through it) and the dashboard call it.
No index is added for it, so a start costs what it did (one ZADD to the queued index, about 145
bytes per entry of a 32-character id on Redis 7.0; no write at all for the listing):

- ``status`` and ``tenant`` choose which indexes are read (served by the index);
- ``created_after`` bounds the scan too: an execution is updated no earlier than it was created,
  so entries scored before it are never read;
- ``flow``, ``version``, ``parent_id`` and ``created_before`` are tested on each document read: a
  bounded scan, at most ``max_scanned`` index entries a call (``MAX_SCANNED``, 10 000). A call
  that stops there returns the rows it found and a cursor at the last entry it read (``capped``):
  call again with it to go on. An index per filter would cost every start (and every status
  change) one more write per filter, kept and trimmed, for queries operators make now and then.

The cursor is opaque: the (update time, tenant, id) of the last entry the page covered. Pages
after it never repeat or skip an execution that stays where it is; one that starts or is updated
while you page moves to the front (the next first page shows it), not into later pages.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from plaita.flows.model.bodies import PARENT_FIELD
from plaita.store.executions.execution_docs import UnreadableExecution
from plaita.store.executions.index_scan import Position, keep_all, scan
from plaita.store.executions.store import ALL_STATUSES

#: Rows one call returns at most.
MAX_LIMIT = 1000
#: Index entries one call reads at most (a filter the index cannot serve scans this far, no further).
MAX_SCANNED = 10_000
#: History outcomes that end one attempt of a step (``plaita.flows.model.failures.history_entry``).
ATTEMPT_ENDS = frozenset({"ok", "failed", "error"})
#: Outcomes of a step's own run (the others mark a restart, a resume, a fork).
RUN_OUTCOMES = ATTEMPT_ENDS | {"suspended", "sleep"}


@dataclass(frozen=True)
class ExecutionRow:
    """One execution as ``FlowClient.list`` returns it. ``tenant`` is "" for the default tenant;
    ``params`` and ``result`` are None unless asked for (``include_params``, ``include_result``:
    ``result`` is the last step's output of a completed execution)."""

    execution_id: str
    tenant: str
    flow_id: str | None
    status: str
    step: str | None
    version: str | None
    parent_id: str | None
    steps_run: int
    created_at: float | None
    updated_at: float
    ended_at: float | None
    error: dict[str, Any] | None
    params: dict[str, Any] | None = None
    result: Any = None


@dataclass(frozen=True)
class ExecutionPage:
    """One page: ``rows`` newest update first; ``cursor`` for the next page (None: no index entry
    follows; with a filter, the next page may still come back empty);
    ``unreadable`` keys met (left out, never touched); ``capped``: ``MAX_SCANNED`` entries were
    read before ``limit`` rows were found (``cursor`` goes on from there)."""

    rows: list[ExecutionRow]
    cursor: str | None
    unreadable: list[UnreadableExecution]
    capped: bool
    #: Index entries this call read (each one document read).
    scanned: int


@dataclass(frozen=True)
class StepRow:
    """One step of an execution, over the history it keeps (its newest 200 entries).
    ``attempts``: attempts that ended (failed, then ok or error); ``outcome``: the last one's
    (``ok``, ``failed``, ``error``, ``suspended``, ``sleep``), ``running`` while it runs;
    ``error``: the last attempt's error, None once it succeeded; ``output`` only when asked."""

    name: str
    attempts: int
    outcome: str
    started_at: float | None
    ended_at: float | None
    error: str | None
    output: Any = None


class ListFilters(TypedDict, total=False):
    """The filters and page bounds ``FlowClient.list`` passes on to ``list_executions`` (its
    defaults: every filter None, ``limit`` 50, no params or results)."""

    status: str | Sequence[str] | None
    flow: str | None
    parent_id: str | None
    created_after: float | None
    created_before: float | None
    version: str | None
    limit: int
    cursor: str | None
    include_params: bool
    include_result: bool


def list_executions(
    stores: Sequence[Any],
    *,
    status: str | Sequence[str] | None = None,
    flow: str | None = None,
    parent_id: str | None = None,
    created_after: float | None = None,
    created_before: float | None = None,
    version: str | None = None,
    limit: int = 50,
    cursor: str | None = None,
    include_params: bool = False,
    include_result: bool = False,
    max_scanned: int = MAX_SCANNED,
) -> ExecutionPage:
    """A page of the executions of ``stores`` (an ``ExecutionStore`` per tenant to list) that
    match every filter given, newest update first; ValueError for a bad filter, limit or cursor."""
    statuses = _statuses(status)
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"limit must be a whole number from 1 to {MAX_LIMIT}, not {limit!r}")
    low, high = _time(created_after, "created_after"), _time(created_before, "created_before")
    wanted = {"flow_id": flow, "version": version}
    filters = {k: v for k, v in wanted.items() if v is not None}

    def keep(doc: dict[str, Any]) -> bool:
        if any(doc.get(k) != v for k, v in filters.items()) or (parent_id is not None and _parent(doc) != parent_id):
            return False
        created = _number(doc.get("created_at"))
        return (low is None or (created is not None and created >= low)) and (
            high is None or (created is not None and created < high)
        )

    plain = not filters and parent_id is None and low is None and high is None
    found = scan(
        stores,
        statuses,
        after=decode_cursor(cursor),
        min_score=low,
        keep=keep_all if plain else keep,
        limit=limit,
        max_scanned=max_scanned,
    )
    rows = [_row(pos, status_, doc, include_params, include_result) for pos, status_, doc in found.rows]
    following = None if found.next_after is None else encode_cursor(found.next_after)
    return ExecutionPage(rows, following, found.unreadable, found.capped, found.scanned)


def stores_of(store: Any, *, tenant: str | None = None, all_tenants: bool = False) -> list[Any]:
    """The ``ExecutionStore`` of each tenant a listing reads: ``store``'s own tenant, ``tenant``'s,
    or with ``all_tenants`` the default tenant's and every one in ``plaita:tenants``. ValueError
    for both, or an invalid tenant id."""
    if all_tenants and tenant is not None:
        raise ValueError("all_tenants lists every tenant: give it without tenant")
    if not all_tenants:
        return [store if tenant is None else store.for_tenant(tenant)]
    default = store.for_tenant(None)
    return [default, *(default.for_tenant(t) for t in default.tenants())]


def steps_of(doc: dict[str, Any], *, include_output: bool = False) -> list[StepRow]:
    """The steps ``doc`` (an execution's document) ran, in the order each first ran."""
    history = doc.get("history") if isinstance(doc.get("history"), list) else []
    runs: dict[str, list[dict[str, Any]]] = {}
    for entry in history or []:
        if isinstance(entry, dict) and entry.get("outcome") in RUN_OUTCOMES and isinstance(entry.get("step"), str):
            runs.setdefault(entry["step"], []).append(entry)
    current = doc.get("step")
    if doc.get("status") == "running" and isinstance(current, str) and current not in runs:
        runs[current] = []  # its first attempt runs now: no entry yet
    results = doc.get("results") if isinstance(doc.get("results"), dict) else {}
    return [_step(name, entries, doc, results or {}, include_output) for name, entries in runs.items()]


def _step(
    name: str, entries: list[dict[str, Any]], doc: dict[str, Any], results: dict[str, Any], include_output: bool
) -> StepRow:
    last = entries[-1] if entries else {}
    outcome = str(last.get("outcome", "running"))
    if doc.get("status") == "running" and doc.get("step") == name and outcome != "ok":
        outcome = "running"  # a retry of it (or its resumed run) is under way
    error = last.get("error") if outcome in ("failed", "error", "running") and last.get("error") else None
    return StepRow(
        name=name,
        attempts=sum(1 for e in entries if e.get("outcome") in ATTEMPT_ENDS),
        outcome=outcome,
        started_at=_number(entries[0].get("started_at")) if entries else None,
        ended_at=_number(last.get("ended_at")) if outcome in ATTEMPT_ENDS else None,
        error=None if error is None else str(error),
        output=results.get(name) if include_output else None,
    )


def _row(pos: Position, status: str, doc: dict[str, Any], params: bool, result: bool) -> ExecutionRow:
    error = doc.get("error")
    steps_run = doc.get("steps_run")
    outputs = doc.get("results")
    return ExecutionRow(
        execution_id=pos.execution_id,
        tenant=pos.tenant,
        flow_id=_text(doc.get("flow_id")),
        status=status,
        step=_text(doc.get("step")),
        version=_text(doc.get("version")),
        parent_id=_parent(doc),
        steps_run=steps_run if isinstance(steps_run, int) and not isinstance(steps_run, bool) else 0,
        created_at=_number(doc.get("created_at")),
        updated_at=pos.score,
        ended_at=_number(doc.get("ended_at")),
        error=error if isinstance(error, dict) else None,
        params=doc.get("params") if params and isinstance(doc.get("params"), dict) else None,
        result=outputs.get(doc.get("step")) if result and status == "completed" and isinstance(outputs, dict) else None,
    )


def encode_cursor(pos: Position) -> str:
    """The opaque cursor of a position: URL-safe text."""
    raw = json.dumps([repr(pos.score), pos.tenant, pos.execution_id], ensure_ascii=False).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str | None) -> Position | None:
    """The position a cursor names; ValueError for text no listing returned."""
    if cursor is None:
        return None
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        score, tenant, eid = json.loads(raw)
        pos = Position(float(score), str(tenant), str(eid))
    except (ValueError, TypeError) as exc:  # bad base64, bad JSON, wrong shape
        raise ValueError(f"not a cursor a listing returned: {cursor!r}") from exc
    if not math.isfinite(pos.score):
        raise ValueError(f"not a cursor a listing returned: {cursor!r}")
    return pos


def _statuses(status: str | Sequence[str] | None) -> tuple[str, ...]:
    chosen = ALL_STATUSES if status is None else (status,) if isinstance(status, str) else tuple(status)
    unknown = [s for s in chosen if s not in ALL_STATUSES]
    if unknown or not chosen:
        raise ValueError(f"status must be among {', '.join(ALL_STATUSES)}, not {unknown or chosen!r}")
    return tuple(dict.fromkeys(chosen))


def _time(value: float | None, name: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} must be epoch seconds (a finite number), not {value!r}")
    return float(value)


def _parent(doc: dict[str, Any]) -> str | None:
    link = doc.get(PARENT_FIELD)
    return _text(link.get("id")) if isinstance(link, dict) else None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
