"""Every task this worker read and has not settled yet, shared by the owner, the handlers'
outcome router, the renewer and the drainer (each under the table's one lock)."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from plaita.store.leases import Lease
from plaita.tasks import Task

#: Which execution lease a task takes: its execution id (the default tenant), or (id, keyspace) for a
#: tenant's task, whose lease is another key (``plaita.store.keyspace``): equal ids of two tenants
#: are two executions.
LeaseRef = str | tuple[str, Any]


def lease_ref(task: Task) -> LeaseRef:
    return (task.execution_id, task.keyspace) if task.tenant_id else task.execution_id


@dataclass(slots=True)
class InFlight:
    """A task read by this worker and not yet settled (slotted: one is built per task read)."""

    task: Task
    fields: dict[str, bytes]
    lease: Lease | None = None
    renewed_at_s: float = 0.0
    lost: bool = False
    #: When it was read (monotonic); a task without execution_id gets its lease lazily.
    read_at_s: float = 0.0
    #: Its outcome went to the settler, which may release the lease any moment now.
    settling: bool = False


class InFlightTable:
    """Thread-safe map of message id -> InFlight."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: dict[str, InFlight] = {}
        #: Executions whose lease acquire failed without an answer: Redis may hold an orphan lease.
        self._orphan_suspects: set[LeaseRef] = set()

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def __contains__(self, message_id: object) -> bool:
        with self._lock:
            return message_id in self._items

    def add(self, item: InFlight) -> None:
        with self._lock:
            self._items[item.task.message_id] = item

    def add_many(self, items: list[InFlight]) -> None:
        """``add`` for a whole read batch (one lock round, not one per task)."""
        with self._lock:
            for item in items:
                self._items[item.task.message_id] = item

    def present(self, message_ids: Iterable[str]) -> set[str]:
        """Which of ``message_ids`` are in flight (one lock round for a batch)."""
        with self._lock:
            return {mid for mid in message_ids if mid in self._items}

    def ids(self) -> set[str]:
        with self._lock:
            return set(self._items)

    def live(self) -> list[InFlight]:
        """Items whose lease is not lost."""
        with self._lock:
            return [i for i in self._items.values() if not i.lost]

    def begin_settling(self, message_ids: Iterable[str]) -> list[InFlight | None]:
        """Look items up and mark them settling (before their outcome reaches the settler)."""
        with self._lock:
            items = [self._items.get(mid) for mid in message_ids]
            for item in items:
                if item is not None:
                    item.settling = True
            return items

    def pop(self, message_ids: Iterable[str]) -> list[InFlight]:
        with self._lock:
            return [item for mid in message_ids if (item := self._items.pop(mid, None)) is not None]

    def abandon_all(self) -> list[InFlight]:
        """Mark every live item lost (its late finish must not ack) and cancel it; returns them."""
        with self._lock:
            left = [i for i in self._items.values() if not i.lost]
            for item in left:
                item.lost = True
                item.task.cancelled.set()
            return left

    def runs_execution(self, ref: LeaseRef) -> bool:
        """True while a task of execution ``ref`` (``lease_ref``) is in flight here."""
        with self._lock:
            return any(lease_ref(i.task) == ref for i in self._items.values())

    def suspect_orphans(self, refs: Iterable[LeaseRef]) -> None:
        with self._lock:
            self._orphan_suspects.update(refs)

    def take_orphan_suspects(self) -> set[LeaseRef]:
        """Suspects with no task of theirs in flight here (only those are safe to release)."""
        with self._lock:
            busy = {lease_ref(i.task) for i in self._items.values()}
            ready = self._orphan_suspects - busy
            self._orphan_suspects -= ready
            return ready
