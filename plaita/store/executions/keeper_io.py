"""``StoreKeeperIO``: the keeper's door (``plaita.flows.keeper_io.KeeperIO``) onto Redis.

One queue's keeper calls, on the clients the keeper was given: the keeper lease, the tenants and
each tenant's executions (``ExecutionStore``, whose ``KeeperAccess`` part is what the keeper
calls: ``plaita.store.executions.keeper_store``), the queue's streams (an enqueue, the execution
ids of its tasks), the schedules' bookkeeping (``ScheduleStore``) and the queue's recorded
schedules (``ScheduleRecords``, on the queue's client, as before the door), and which kind of
failure an exception is (``plaita.store.errors``). Every call runs on the caller's thread: the
keeper has its own.
"""

from __future__ import annotations

from typing import Any

from plaita.fsm import ErrorKind
from plaita.store import errors
from plaita.store.executions.schedule_records import ScheduleRecords
from plaita.store.executions.schedule_store import ScheduleStore
from plaita.store.executions.store import ExecutionStore
from plaita.store.streams.queue import StreamQueue


class StoreKeeperIO:
    """The keeper's calls for ``queue``, its executions in ``store`` (None: the queue's keyspace
    on the queue's client, ``ExecutionStore.sharing``)."""

    def __init__(self, queue: StreamQueue, store: ExecutionStore | None = None) -> None:
        self._queue = queue
        self._store = store if store is not None else ExecutionStore.sharing(queue)
        self._schedules = ScheduleStore.sharing(queue)
        self._records = ScheduleRecords.sharing(queue, queue.keyspace.queue)

    # -- the keeper lease ---------------------------------------------------------------------
    @property
    def keeper_lease_key(self) -> str:
        return self._store.keeper_lease_key

    def hold_keeper_lease(self, holder: str, ttl_ms: int) -> bool:
        return self._store.hold_keeper_lease(holder, ttl_ms)

    def keeper_lease_holder(self) -> str | None:
        return self._store.keeper_lease_holder()

    def release_keeper_lease(self, holder: str) -> None:
        self._store.release_keeper_lease(holder)

    # -- the executions, per tenant ------------------------------------------------------------
    def keeper_tenants(self) -> list[str]:
        return self._store.keeper_tenants()

    def for_tenant(self, tenant_id: str | None) -> ExecutionStore:
        """The tenant's ``ExecutionStore`` (cached by the store): its ``KeeperAccess`` methods are
        the keeper's ``KeeperTenantIO``."""
        return self._store.for_tenant(tenant_id)

    # -- the queue's streams -----------------------------------------------------------------
    def enqueue(self, body: dict[str, Any]) -> str:
        return self._queue.enqueue(body)

    def execution_ids(self, max_entries: int) -> tuple[set[str], bool]:
        return self._queue.execution_ids(max_entries)

    # -- schedules ---------------------------------------------------------------------------
    @property
    def schedules(self) -> ScheduleStore:
        return self._schedules

    @property
    def schedule_records(self) -> ScheduleRecords:
        return self._records

    # -- failures and the connections -----------------------------------------------------------
    def failure_kind(self, exc: BaseException) -> ErrorKind:
        return errors.classify(exc)

    def is_redis_failure(self, exc: BaseException) -> bool:
        return errors.is_redis_failure(exc)

    def interrupt(self) -> None:
        self._store.interrupt()

    def close(self) -> None:
        self._queue.close()
