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
document from the start, so its record answers at once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from plaita.flows import model
from plaita.flows.children import cancel_descendants
from plaita.flows.limits import member_of
from plaita.store.executions import FLAG_TTL_S, MAX_SCANNED_ENTRIES, TERMINAL, ExecutionStore
from plaita.store.executions import QUEUED as QUEUED_STATUS
from plaita.store.flow_limits import FlowLimitStore

#: ``CancelOutcome.outcome``: the cancel is recorded and the execution will end ``cancelled``.
QUEUED, RUNNING, SUSPENDED, UNSEEN = "queued", "running", "suspended", "unseen"
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
            ALREADY_CANCELLED: f"execution {eid} already cancelled",
        }.get(self.outcome, f"execution {eid} already {self.status}; nothing to cancel")


def request_cancel(
    store: ExecutionStore, enqueue: Callable[[dict[str, Any]], Any], execution_id: str, stream: str
) -> CancelOutcome | None:
    """Cancel ``execution_id`` (``enqueue`` sends a task; ``stream``: where its start would be
    queued); None when it has no document and no start of it is queued. The flag is set before
    the document is read again, so whatever a worker did meanwhile (created it, suspended it)
    the cancel lands."""
    doc = store.get(execution_id)
    queued: bool | None = None
    parked: dict[str, Any] | None = None
    if doc is None or doc.get("status") == QUEUED_STATUS:  # its start may be parked for a slot
        parked = FlowLimitStore(store.client, store.ks).parked_start(member_of(store.ks.tenant, execution_id))
    if doc is None and parked is None:
        queued = store.start_queued(execution_id, stream)
        if queued is False:
            doc = store.get(execution_id)  # created (maybe ended) while the stream was read
            if doc is None:
                return None
    elif doc is None:
        queued = True
    if doc is not None and doc.get("status") in TERMINAL:
        return _ended(execution_id, doc)
    store.request_cancel(execution_id)
    if parked is not None:  # read with its flag set: it takes no slot, leaves the parked starts, ends
        enqueue(parked)
    doc = store.get(execution_id)
    status = None if doc is None else doc.get("status")
    if doc is None:
        return CancelOutcome(execution_id, UNSEEN if queued is None else QUEUED, None)
    if status in TERMINAL:
        return _ended(execution_id, doc)
    if status == QUEUED_STATUS:  # recorded by its producer, not taken by a worker yet
        return CancelOutcome(execution_id, QUEUED, doc)
    if status != "suspended":
        return CancelOutcome(execution_id, RUNNING, doc)
    flow_id, tenant = doc.get("flow_id"), store.ks.tenant
    enqueue(model.resume_body(execution_id, "cancel", flow_id=flow_id, tenant_id=tenant))
    return CancelOutcome(execution_id, SUSPENDED, doc, cancel_descendants(store, doc))


def _ended(execution_id: str, doc: dict[str, Any]) -> CancelOutcome:
    return CancelOutcome(execution_id, ALREADY_CANCELLED if doc.get("status") == "cancelled" else ENDED, doc)
