"""Cancel an execution whatever it is doing (``FlowClient.cancel``, ``plaita executions cancel``,
the dashboard), and say what was done.

A cancel is the flag ``Keyspace.cancel_key(id)`` (7 days), which every worker honours: a start
read with it set runs no step (also one that waits for a flow slot: it takes none), a running
execution ends ``cancelled`` at its next checkpoint (the checkpoint script refuses a
``completed`` result while it is set), a suspension written after it ends at once. A suspended
execution holds no lease and runs no step, so it is also sent a ``cancel`` task; a parent waiting
on children has their flags set here too (and their children's, …), so its children stop at
their next checkpoint instead of its cancel task waiting behind theirs. An id with no document
yet is cancelled only if a start of it is queued (or the queue is too long to tell) or parked
for a flow slot: a parked start is put back on its stream at once (after the flag is set), so
the cancel lands now, not when a slot frees. A start this plaita's producer sent has a ``queued``
document from the start, so its record answers at once. A delayed start (``FlowClient.start(delay_s=…)``)
is queued too: its task is made due now (after the flag is set), so it ends cancelled at the next
reclaim pass of any worker, not when due; its flag lives until the due time plus 7 days all the same.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from plaita.clock import wall_s
from plaita.flows.model import bodies as model
from plaita.flows.model.bodies import child_ids
from plaita.store.executions.flow_limits import FlowLimitStore, member_of
from plaita.store.executions.store import FLAG_TTL_S, MAX_SCANNED_ENTRIES, TERMINAL, ExecutionStore
from plaita.store.executions.store import QUEUED as QUEUED_STATUS

#: ``CancelOutcome.outcome``: the cancel is recorded and the execution will end ``cancelled``.
QUEUED, RUNNING, SUSPENDED, UNSEEN = "queued", "running", "suspended", "unseen"
#: ``CancelOutcome.outcome``: the cancel landed and a worker had already ended the execution
#: ``cancelled`` when the cancel read its document again (a queued start read at once, a step
#: that saw ``ctx.cancel`` at once).
CANCELLED = "cancelled"
#: ``CancelOutcome.outcome``: it had ended before; only ``ENDED`` (completed, error) means the
#: cancel did not land.
ALREADY_CANCELLED, ENDED = "already_cancelled", "ended"


@dataclass(frozen=True)
class CancelOutcome:
    """What a cancel did to ``execution_id``: ``outcome`` (above), the document as it was once
    the flag was set (None: its start not read yet) and how many descendants it reached."""

    execution_id: str
    outcome: str
    doc: dict[str, Any] | None
    children: int = 0

    @property
    def status(self) -> str | None:
        """The execution's status once the cancel was recorded (None: no document yet)."""
        return None if self.doc is None else str(self.doc.get("status"))

    @property
    def landed(self) -> bool:
        """True unless the execution had ended ``completed`` or ``error`` before the cancel."""
        return self.outcome != ENDED

    def describe(self) -> str:
        """One line for an operator: what was done, and what happens next."""
        eid, days = self.execution_id, FLAG_TTL_S // 86400
        kids = f"; cancel requested for {self.children} descendant execution(s)" if self.children else ""
        return {
            QUEUED: f"cancel recorded; execution {eid} is queued and will end cancelled when a worker reads it"
            " (no step runs)",
            RUNNING: f"cancel recorded; execution {eid} is running: it ends cancelled at its next checkpoint"
            " (the step running sees ctx.cancel; a result it returns is discarded)",
            SUSPENDED: f"cancel recorded; execution {eid} is suspended: a cancel task is enqueued, it ends cancelled"
            f" as soon as a worker takes it{kids}",
            UNSEEN: f"cancel recorded; execution {eid} does not exist yet and the queue is longer than"
            f" {MAX_SCANNED_ENTRIES} tasks, so its start was not looked for: a start of it read within {days}"
            " days ends cancelled",
            CANCELLED: f"cancel recorded; execution {eid} ended cancelled",
            ALREADY_CANCELLED: f"execution {eid} already cancelled",
        }.get(self.outcome, f"execution {eid} already {self.status}; nothing to cancel")


def request_cancel(
    store: ExecutionStore, enqueue: Callable[[dict[str, Any]], Any], execution_id: str, streams: list[str]
) -> CancelOutcome | None:
    """Cancel ``execution_id`` (``enqueue`` sends a task; ``streams``: where its start would be
    queued, its partition's stream and each priority level's in use); None when it has no
    document and no start of it is queued. The flag is set before the document is read again, so
    whatever a worker did meanwhile (created it, suspended it) the cancel lands."""
    doc = store.get(execution_id)
    queued: bool | None = None
    parked: dict[str, Any] | None = None
    if doc is None or doc.get("status") == QUEUED_STATUS:  # its start may be parked for a slot
        parked = FlowLimitStore.sharing(store).parked_start(member_of(store.ks.tenant, execution_id))
    if doc is None and parked is None:
        queued = _start_queued(store, execution_id, streams)
        if queued is False:
            doc = store.get(execution_id)  # created (maybe ended) while the stream was read
            if doc is None:
                return None
    elif doc is None:
        queued = True
    if doc is not None and doc.get("status") in TERMINAL:
        return _ended(execution_id, doc)
    store.request_cancel(execution_id, ttl_s=_flag_ttl_s(doc))
    if parked is not None:  # read with its flag set: it takes no slot, leaves the parked starts, ends
        enqueue(parked)
    _start_delayed_now(store, doc, streams)
    doc = store.get(execution_id)
    status = None if doc is None else doc.get("status")
    if doc is None:
        return CancelOutcome(execution_id, UNSEEN if queued is None else QUEUED, None)
    if status == "cancelled":  # it was not when the flag was set: a worker ended it on this flag
        return CancelOutcome(execution_id, CANCELLED, doc)
    if status in TERMINAL:
        return _ended(execution_id, doc)
    if status == QUEUED_STATUS or parked is not None:
        # Recorded by its producer and not taken by a worker yet; or parked for a flow slot (its
        # document may say running: a worker creates ahead before it looks for a slot), re-added
        # above with its flag set, so it ends cancelled when read, without a step or a slot.
        return CancelOutcome(execution_id, QUEUED, doc)
    if status != "suspended":
        return CancelOutcome(execution_id, RUNNING, doc)
    flow_id, tenant = doc.get("flow_id"), store.ks.tenant
    enqueue(model.resume_body(execution_id, "cancel", flow_id=flow_id, tenant_id=tenant))
    return CancelOutcome(execution_id, SUSPENDED, doc, cancel_descendants(store, doc))


def _flag_ttl_s(doc: dict[str, Any] | None) -> int:
    """How long the cancel flag must live: 7 days, plus the wait of a delayed start until it is
    due (a start read past its flag would run)."""
    waiting = doc.get("waiting") if doc is not None and doc.get("status") == QUEUED_STATUS else None
    if not isinstance(waiting, dict) or waiting.get("for") != "due":
        return FLAG_TTL_S
    until = waiting.get("until")
    if isinstance(until, bool) or not isinstance(until, int | float) or not math.isfinite(until):
        return FLAG_TTL_S
    return FLAG_TTL_S + max(0, math.ceil(until - wall_s()))


def _start_queued(store: ExecutionStore, execution_id: str, streams: list[str]) -> bool | None:
    """Whether a start of ``execution_id`` waits in any of ``streams`` (None: one was too long to
    read through and none holds it)."""
    answer: bool | None = False
    for stream in streams:
        found = store.start_queued(execution_id, stream)
        if found:
            return True
        answer = None if found is None else answer
    return answer


def _start_delayed_now(store: ExecutionStore, doc: dict[str, Any] | None, streams: list[str]) -> None:
    """A delayed start just cancelled: its task is made due now (after the flag is set), so the
    next reclaim pass moves it, a worker reads it and it ends cancelled, not when it was due."""
    waiting = doc.get("waiting") if doc is not None and doc.get("status") == QUEUED_STATUS else None
    if isinstance(waiting, dict) and waiting.get("for") == "due":
        due_ms, task = waiting.get("due_ms"), waiting.get("task")
        if isinstance(due_ms, int) and not isinstance(due_ms, bool) and isinstance(task, str) and task:
            # Refused by an ACL: it ends cancelled when due. Its set is its priority level's.
            any(store.start_now(stream, due_ms, task) for stream in streams)


def _ended(execution_id: str, doc: dict[str, Any]) -> CancelOutcome:
    return CancelOutcome(execution_id, ALREADY_CANCELLED if doc.get("status") == "cancelled" else ENDED, doc)


#: Executions one cancel of a suspended parent reaches below it at most (children, theirs, …).
MAX_CANCELLED_DESCENDANTS = 100_000


def _waited_on(doc: dict[str, Any]) -> list[str]:
    """The ids of the children a suspended ``doc`` waits on ([] for any other document)."""
    suspension = doc.get("suspension")
    waiting = suspension.get("children") if isinstance(suspension, dict) else None
    if doc.get("status") != "suspended" or not isinstance(waiting, dict):
        return []
    try:
        return child_ids(str(waiting["prefix"]), int(waiting["count"]))
    except (KeyError, TypeError, ValueError):  # not a spawn plaita wrote: nothing to reach
        return []


def cancel_descendants(store: ExecutionStore, doc: dict[str, Any]) -> int:
    """For a suspended parent being cancelled (``plaita.flows.producer.cancel``), before its own cancel
    task runs (it may wait behind its children's tasks): set every child's cancel flag, send a
    ``cancel`` to each suspended one, and the same below each one waiting on children of its own.
    A running child stops at its next checkpoint, a queued one runs no step. Returns how many
    executions it reached (at most ``MAX_CANCELLED_DESCENDANTS``)."""
    level, reached = [doc], 0
    while level and reached < MAX_CANCELLED_DESCENDANTS:
        ids = [eid for d in level for eid in _waited_on(d)][: MAX_CANCELLED_DESCENDANTS - reached]
        if not ids:
            break
        store.request_cancels(ids)
        docs = store.read_many(ids)
        suspended = [
            (e, d) for e, d in zip(ids, docs, strict=True) if isinstance(d, dict) and d.get("status") == "suspended"
        ]
        bodies = [
            model.resume_body(e, "cancel", flow_id=d.get("flow_id"), tenant_id=store.ks.tenant) for e, d in suspended
        ]
        store.enqueue_tasks(bodies)
        reached += len(ids)
        level = [d for _, d in suspended]
    return reached
