"""``KeeperIO``: the one door through which the keeper wing (``plaita.flows.keeper``: the keeper,
its deadline claims, its scheduler and the schedule records) reaches Redis.

The keeper asks for what it needs by name: its lease, the tenants, each tenant's due deadlines
and unleased running executions (``KeeperTenantIO``), the stream's execution ids, an enqueue,
the schedules' bookkeeping (``ScheduleBookIO``) and the queue's recorded schedules
(``ScheduleRecordsIO``), and what kind of failure an exception is. It never holds a Redis client
and imports no store module: one adapter, ``plaita.store.executions.keeper_io.StoreKeeperIO``,
satisfies this protocol structurally. A schedule tick's start is the producer's (``Starter``:
``FlowClient.start``), handed to the scheduler where the keeper is put together
(``plaita.ops.keeper_build``), so the keeper imports no producer either.

What the door raises for a key of another type (``UnreadableExecution``, ``UnreadableIndex``,
``UnreadableSchedule``) and the schedule hash's pause field are named here, so the keeper wing
reaches them without a store import.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from plaita.fsm import ErrorKind
from plaita.store.executions.execution_docs import UnreadableExecution as UnreadableExecution
from plaita.store.executions.keeper_store import UnreadableIndex as UnreadableIndex
from plaita.store.executions.schedule_store import UnreadableSchedule as UnreadableSchedule
from plaita.store.schedule_control import PAUSED_FIELD as PAUSED_FIELD

__all__ = [
    "PAUSED_FIELD",
    "KeeperIO",
    "KeeperTenantIO",
    "ScheduleBookIO",
    "ScheduleRecordsIO",
    "Starter",
    "UnreadableExecution",
    "UnreadableIndex",
    "UnreadableSchedule",
]


class KeeperTenantIO(Protocol):
    """One tenant's executions as the keeper reads and ends them. An index of another type raises
    ``UnreadableIndex`` naming it; an execution key holding none is read as ``UnreadableExecution``."""

    @property
    def tenant(self) -> str:
        """The tenant's id; "" for the default tenant."""
        ...

    def due_deadlines(self, now_s: float, rearm_at_s: float, limit: int, *, dry_run: bool) -> list[str]:
        """Suspended executions past their deadline, claimed (re-armed to ``rearm_at_s``) unless dry run."""
        ...

    def unclaim_deadlines(self, execution_ids: Sequence[str], rearm_at_s: float, due_at_s: float) -> int:
        """Move deadlines still at the claim's ``rearm_at_s`` to ``due_at_s``: how many moved."""
        ...

    def earliest_deadline(self) -> float | None:
        """The earliest suspension deadline (epoch seconds), or None."""
        ...

    def forget_deadline(self, execution_id: str) -> None:
        """Drop a deadline whose execution is no longer suspended."""
        ...

    def read_many(self, execution_ids: Sequence[str]) -> list[dict[str, Any] | None | UnreadableExecution]:
        """Each execution's document (None: none), an unreadable one as its error."""
        ...

    def running_since(self, before_s: float, offset: int, limit: int) -> list[tuple[str, float]]:
        """Running executions last updated before ``before_s``, oldest first: (id, updated_at)."""
        ...

    def leased(self, execution_ids: Sequence[str]) -> list[bool]:
        """Whether each execution's lease is held."""
        ...

    def still_running(self, execution_ids: Sequence[str]) -> list[float | None]:
        """Each execution's update time while it is running (None: not running)."""
        ...

    def mark_retry_sent(self, execution_id: str, cooldown_s: int) -> bool:
        """True if no recovery retry was sent for it within the cooldown (and mark one sent)."""
        ...

    def clear_retry_mark(self, execution_id: str) -> None:
        """Take the mark back: the retry was not sent."""
        ...

    def mark_orphaned(
        self,
        execution_id: str,
        updated_at_s: float,
        error_doc: dict[str, Any],
        now_s: float,
        retention_s: int,
        *,
        follow_up: Callable[[dict[str, Any]], dict[str, Any] | None] | None = None,
    ) -> bool:
        """End a running, unleased execution not updated since ``updated_at_s`` in ``error`` (a
        compare-and-set), with the task ``follow_up(doc)`` names enqueued in the same write."""
        ...


class ScheduleBookIO(Protocol):
    """The schedules' bookkeeping, one hash per scheduled flow (``UnreadableSchedule`` for one of
    another type)."""

    def key(self, flow_id: str) -> str:
        """The flow's schedule key, for messages about it."""
        ...

    def read(self, flow_id: str) -> dict[str, str]:
        """The schedule's fields ({} when never run)."""
        ...

    def describe(self, flow_id: str, definition: Mapping[str, Any]) -> None:
        """Record the definition the keeper runs (what a listing shows)."""
        ...

    def claim(self, flow_id: str, seen_last: str, newest_s: int, pending: str, at: str) -> bool:
        """Compare-and-set the newest tick from ``seen_last`` to ``newest_s`` with ``pending`` ticks."""
        ...

    def confirm(self, flow_id: str, pending: str, pending_at: str, execution_id: str, tick_s: int) -> bool:
        """The ``pending`` ticks were enqueued: forget them, note the newest started."""
        ...


class ScheduleRecordsIO(Protocol):
    """The schedules recorded for one queue by the workers and keepers that load them
    (``UnreadableIndex`` when the key is not a hash)."""

    @property
    def key(self) -> str:
        """The records' key, for messages about it."""
        ...

    def read(self) -> dict[str, str]:
        """Every record, by flow id."""
        ...

    def read_marked(self) -> tuple[dict[str, str], bool]:
        """(every record by flow id, whether the acting keeper's mark is there)."""
        ...

    def write(self, records: Mapping[str, str], *, mark: str | None = None) -> None:
        """Record (or refresh) these records, and the keeper's ``mark`` if given."""
        ...

    def forget(self, flow_id: str, record: str) -> bool:
        """Delete the flow's record if it still is ``record``."""
        ...


class Starter(Protocol):
    """How the scheduler starts a tick's execution (``FlowClient.start``: the producer's own path,
    its queued record and its trace context)."""

    def start(
        self,
        flow_id: str,
        params: dict[str, Any] | None = None,
        *,
        execution_id: str | None = None,
        dedup_key: str | None = None,
    ) -> str: ...


class KeeperIO(Protocol):
    """Every call the keeper wing makes to Redis, for one queue. All block (the keeper runs on
    its own thread); a Redis failure is raised as it is (``failure_kind`` says which)."""

    # -- the keeper lease (per queue) -------------------------------------------------------
    @property
    def keeper_lease_key(self) -> str:
        """The queue's keeper lease, for messages about it."""
        ...

    def hold_keeper_lease(self, holder: str, ttl_ms: int) -> bool:
        """Take or renew the lease: True if ``holder`` holds it now."""
        ...

    def keeper_lease_holder(self) -> str | None:
        """Who holds the lease (None: nobody)."""
        ...

    def release_keeper_lease(self, holder: str) -> None:
        """Hand the lease over at once (only ``holder``'s own)."""
        ...

    # -- the executions, per tenant ----------------------------------------------------------
    def keeper_tenants(self) -> list[str]:
        """Every tenant but the default one with executions; UnreadableIndex for a set of another type."""
        ...

    def for_tenant(self, tenant_id: str | None) -> KeeperTenantIO:
        """``tenant_id``'s executions (None or "": the default tenant's)."""
        ...

    # -- the queue's streams ----------------------------------------------------------------
    def enqueue(self, body: dict[str, Any]) -> str:
        """Add a task (on its execution's partition stream): its entry id."""
        ...

    def execution_ids(self, max_entries: int) -> tuple[set[str], bool]:
        """The execution ids of every task in the queue's streams, and whether all were read
        within ``max_entries`` entries."""
        ...

    # -- schedules --------------------------------------------------------------------------
    @property
    def schedules(self) -> ScheduleBookIO:
        """The schedules' bookkeeping hashes."""
        ...

    @property
    def schedule_records(self) -> ScheduleRecordsIO:
        """The schedules recorded for this queue."""
        ...

    # -- failures and the connections ----------------------------------------------------------
    def failure_kind(self, exc: BaseException) -> ErrorKind:
        """How the keeper backs off after ``exc`` (transient or persistent)."""
        ...

    def is_redis_failure(self, exc: BaseException) -> bool:
        """Whether ``exc`` is a Redis-side failure (which ends a pass) rather than bad data."""
        ...

    def interrupt(self) -> None:
        """Cut calls in progress (best effort), so a stop is not held up by a frozen server."""
        ...

    def close(self) -> None:
        """Close the queue's connections (once no pass runs)."""
        ...
