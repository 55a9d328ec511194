"""The executions tab's reads and buttons: lists from the status index, one execution, cancel,
resume, fork and delete.

Listing reads the per-status sorted sets newest first (never SCAN), then the states in one MGET
per page; a flow filter is applied to those states, so it reads at most MAX_SCANNED index
entries per status before it stops looking. Reads never prune the index: the read-only ACL user
may not write. Cancel, resume, fork and delete go through FlowClient, exactly like ``plaita executions``.
A tenant filter (``?tenant=T``) reads and steers that tenant's executions (its own index and keys).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from plaita.dashboard.actions import ActionError, Outcome
from plaita.dashboard.lineage import WAITING_KINDS, parent_of, waits_as
from plaita.flows.fork import NotForkable
from plaita.flows.model import bodies as model
from plaita.flows.producer.client import ExecutionNotFound, FlowClient
from plaita.flows.retention import NotDeletable
from plaita.store.executions.store import ALL_STATUSES as STATUSES
from plaita.store.executions.store import TERMINAL, ExecutionStore

#: Executions listed on one page at most.
LIST_ROWS = 200
#: Children linked by id under their parent in the list (the parent's page lists them all).
CHILD_LINKS = 20
#: Index entries read per status while looking for a flow filter's matches.
MAX_SCANNED = 2000
#: Index entries read per round trip.
SCAN_PAGE = 200
#: Longest execution id the pages accept (ids are the producer's choice, usually 32 hex digits).
MAX_ID_CHARS = 512
#: Largest resume data accepted from the form (it becomes part of the execution's state).
MAX_DATA_BYTES = 64 * 1024
#: Resume types the form offers, the common one first.
RESUME_TYPES = ("event", *sorted(model.RESUME_TYPES - {"event"}))


def _newest_of(store: ExecutionStore, status: str, flow: str, limit: int, waiting: str = "") -> list[dict[str, Any]]:
    """Up to ``limit`` executions with ``status`` (and ``flow``, and waiting for ``waiting``,
    when given), newest update first."""
    found: list[dict[str, Any]] = []
    for offset in range(0, MAX_SCANNED, SCAN_PAGE):
        page = store.by_status(status, SCAN_PAGE, offset=offset, prune=False)
        found.extend(
            d for d in page if (not flow or d.get("flow_id") == flow) and (not waiting or waits_as(d, waiting))
        )
        if len(found) >= limit or len(page) < SCAN_PAGE:
            break
    return found[:limit]


def tenant_store(store: ExecutionStore, tenant: str) -> ExecutionStore:
    """``tenant``'s store ("" = the default tenant's); ActionError for an invalid tenant id."""
    try:
        return store.for_tenant(tenant or None)
    except ValueError as exc:
        raise ActionError(str(exc)) from None


def tenant_flows(flows: FlowClient, tenant: str) -> FlowClient:
    """``flows`` for ``tenant``'s executions; ActionError for an invalid tenant id."""
    try:
        return flows.for_tenant(tenant or None) if tenant else flows
    except ValueError as exc:
        raise ActionError(str(exc)) from None


def listing(
    store: ExecutionStore, status: str, flow: str, limit: int = LIST_ROWS, waiting: str = "", *, tenant: str = ""
) -> list[dict[str, Any]]:
    """Executions with ``status`` (every status when empty) of ``flow`` (any when empty) of
    ``tenant`` (the default tenant when empty), newest first; with ``waiting`` (one of
    ``WAITING_KINDS``) only the suspended ones waiting for that."""
    if status and status not in STATUSES:
        raise ActionError(f"unknown status {status!r} (one of {', '.join(STATUSES)})")
    if waiting and waiting not in WAITING_KINDS:
        raise ActionError(f"unknown waiting filter {waiting!r} (one of {', '.join(WAITING_KINDS)})")
    if waiting and status not in ("", "suspended"):
        raise ActionError(f"only suspended executions wait (asked for {status} ones waiting for {waiting})")
    store = tenant_store(store, tenant)
    rows: list[dict[str, Any]] = []
    for s in ("suspended",) if waiting else (status,) if status else STATUSES:
        rows.extend(_newest_of(store, s, flow, limit, waiting))
    rows.sort(key=lambda d: _float(d.get("updated_at")), reverse=True)
    return rows[:limit]


def grouped(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` with each child under its parent, so a spawn of hundreds does not bury the list:
    one item per execution that is no child (``doc``) and per parent of the children listed
    (``parent_id``, ``children``, newest first; ``doc`` None when the parent itself is not listed).
    An item sits where its newest member was."""
    items: dict[str, dict[str, Any]] = {}
    for doc in rows:
        link = parent_of(doc)
        key = link["id"] if link else str(doc.get("execution_id"))
        item = items.setdefault(key, {"doc": None, "parent_id": key, "children": [], "by_status": {}})
        if link is None:
            item["doc"] = doc
            continue
        item["children"].append(doc)
        status = str(doc.get("status"))
        item["by_status"][status] = item["by_status"].get(status, 0) + 1
    return list(items.values())


def valid_id(execution_id: str) -> bool:
    return 0 < len(execution_id) <= MAX_ID_CHARS


def timeline(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The history entries as the page shows them, with each step's duration; the run of a step
    that a resume or message woke carries what it consumed (``consumed``: the ``resumed`` entry's
    resume id, type and the wait or message topic it was for)."""
    rows: list[dict[str, Any]] = []
    woke: dict[str, Any] | None = None
    for entry in doc.get("history") or []:
        if not isinstance(entry, dict):
            continue
        started, ended = entry.get("started_at"), entry.get("ended_at")
        took = _float(ended) - _float(started) if started is not None and ended is not None else None
        row = {**entry, "took_s": took}
        if entry.get("outcome") == "resumed":
            woke = {k: entry.get(k) for k in ("resume_id", "resume_type", "wait_for")} | {"step": entry.get("step")}
        elif woke is not None:
            if woke["step"] == entry.get("step"):
                row["consumed"] = woke
            woke = None
        rows.append(row)
    return rows


def pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


def cancel(flows: FlowClient, execution_id: str) -> Outcome:
    """Cancel it (``plaita.flows.producer.cancel``): queued, running or suspended, it ends ``cancelled``."""
    if not valid_id(execution_id):
        raise ActionError("not an execution id")
    try:
        done = flows.cancel(execution_id)
    except ExecutionNotFound:
        raise ActionError(f"no execution {execution_id!r} (never started, or expired)") from None
    status = done.status
    if status in TERMINAL:
        raise ActionError(f"execution {execution_id!r} already ended ({status}): nothing to cancel")
    if done.doc is None:
        return Outcome(done.describe(), [])
    when = "at once" if status == "suspended" else "at its next step boundary"
    return Outcome(f"cancel requested for execution {execution_id!r}: it stops {when}", [])


def resume(
    flows: FlowClient, execution_id: str, resume_type: str, data_text: str, resume_id: str, wait_for: str = ""
) -> Outcome:
    """Enqueue a resume (addressed to the wait ``wait_for`` names, when given); ``resume_id``
    (the form's own) makes a form sent twice resume once."""
    if resume_type not in model.RESUME_TYPES:
        raise ActionError(f"unknown resume type {resume_type!r} (one of {', '.join(RESUME_TYPES)})")
    data = _data(data_text)
    doc = _known(execution_id, lambda: flows.get(execution_id) or {})
    if doc.get("status") in TERMINAL:
        raise ActionError(f"execution {execution_id!r} already ended ({doc.get('status')}): nothing to resume")
    try:
        task_id = flows.resume(execution_id, resume_type, data, resume_id=resume_id or None, wait_for=wait_for or None)
    except ValueError as exc:  # a wait name on a resume that is no event, or too long
        raise ActionError(str(exc)) from None
    to = f" for wait {wait_for!r}" if wait_for else ""
    return Outcome(f"{resume_type} resume{to} of execution {execution_id!r} enqueued as task {task_id}", [])


def fork_steps(doc: dict[str, Any]) -> list[str]:
    """The steps a fork may start at: those the execution ran, in the order it first ran them
    (none while it is queued: it ran nothing)."""
    if doc.get("status") == "queued":
        return []
    order = [e.get("step") for e in doc.get("history") or [] if isinstance(e, dict)]
    order += [*(doc.get("results") or {}), doc.get("step")]
    return [s for s in dict.fromkeys(order) if isinstance(s, str)]


def fork(flows: FlowClient, execution_id: str, from_step: str) -> tuple[str, Outcome]:
    """``FlowClient.fork`` at ``from_step``: (the new id, the outcome); the original is left as it is."""
    _known(execution_id, lambda: flows.get(execution_id))
    if not from_step:
        raise ActionError("pick the step the new execution starts at")
    try:
        new_id = flows.fork(execution_id, from_step)
    except NotForkable as exc:
        raise ActionError(str(exc)) from None
    return new_id, Outcome(f"execution {new_id!r} forked from {execution_id!r} at step {from_step!r} and started", [])


def delete(flows: FlowClient, execution_id: str) -> Outcome:
    """``FlowClient.delete`` of an ended execution (never forced: cancel a live one first)."""
    doc = _known(execution_id, lambda: flows.get(execution_id))
    try:
        (done,) = flows.delete(execution_id)
    except NotDeletable:
        raise ActionError(
            f"execution {execution_id!r} is {doc.get('status')}: only an ended one is deleted (cancel it first)"
        ) from None
    if done.outcome == "missing":
        return Outcome(f"execution {execution_id!r} was gone already (expired or deleted)", [])
    return Outcome(f"execution {execution_id!r} ({done.status}) deleted with every key it owned", [])


def _data(text: str) -> Any:
    if not text.strip():
        return None
    if len(text.encode("utf-8")) > MAX_DATA_BYTES:
        raise ActionError(f"resume data is over {MAX_DATA_BYTES} bytes")
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ActionError(f"resume data is not valid JSON: {exc}") from None


def _known(execution_id: str, call: Callable[[], dict[str, Any] | None]) -> dict[str, Any]:
    if not valid_id(execution_id):
        raise ActionError("not an execution id")
    try:
        doc = call()
    except ExecutionNotFound:
        doc = None
    if not doc:
        raise ActionError(f"no execution {execution_id!r} (never started, or expired)")
    return dict(doc)


def _float(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0


__all__ = [
    "LIST_ROWS", "RESUME_TYPES", "STATUSES", "TERMINAL", "WAITING_KINDS",
    "cancel", "grouped", "listing", "pretty", "resume", "tenant_flows", "tenant_store", "timeline", "valid_id",
]  # fmt: skip
