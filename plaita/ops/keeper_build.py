"""A keeper put together: its door on Redis, its scheduler and the producer that starts ticks.

The keeper wing (``plaita.flows.keeper``) imports no store module and no producer: it reaches
Redis through ``plaita.flows.keeper_io.KeeperIO`` and starts a schedule tick through a
``Starter``. This is where those are built and handed in (``StoreKeeperIO``, ``FlowClient``), for
``plaita keeper`` (``plaita.cli.keeper``), the worker's embedded keeper (``plaita.ops.service``)
and the tests.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from plaita.clock import wall_s
from plaita.flows.keeper.keeper import Keeper, KeeperSettings
from plaita.flows.keeper.schedule_records import RECORD_TTL_S
from plaita.flows.keeper.scheduler import PENDING_STALE_S, Scheduler
from plaita.flows.model.definition import Flow
from plaita.flows.producer.client import FlowClient
from plaita.store.executions.keeper_io import StoreKeeperIO
from plaita.store.executions.store import ExecutionStore
from plaita.store.streams.queue import StreamQueue


def build_scheduler(
    flows: Iterable[Flow],
    queue: StreamQueue,
    *,
    store: ExecutionStore | None = None,
    pending_stale_s: float = PENDING_STALE_S,
    record_ttl_s: float = RECORD_TTL_S,
) -> Scheduler:
    """The schedule pass over ``queue`` (its executions in ``store``, None: the queue's own): the
    ticks of ``flows``' schedules and of every one recorded for the queue, started by a
    ``FlowClient``."""
    return _scheduler(flows, StoreKeeperIO(queue, store), FlowClient(queue, store), pending_stale_s, record_ttl_s)


def _scheduler(
    flows: Iterable[Flow], io: StoreKeeperIO, starter: FlowClient, pending_stale_s: float, record_ttl_s: float
) -> Scheduler:
    return Scheduler(flows, io, starter, pending_stale_s=pending_stale_s, record_ttl_s=record_ttl_s)


def build_keeper(
    store: ExecutionStore,
    queue: StreamQueue,
    settings: KeeperSettings | None = None,
    *,
    flows: Iterable[Flow] = (),
    scheduler: Scheduler | None = None,
    clock: Callable[[], float] = wall_s,
    on_orphaned: Callable[[str, str, float], None] | None = None,
) -> Keeper:
    """A keeper of ``queue`` and its executions in ``store``: its door ``StoreKeeperIO``, and the
    scheduler given or one of ``flows`` on the same door (give one or the other: ValueError)."""
    io = StoreKeeperIO(queue, store)
    if scheduler is None:
        scheduler = _scheduler(flows, io, FlowClient(queue, store), PENDING_STALE_S, RECORD_TTL_S)
    elif tuple(flows):
        raise ValueError("build_keeper takes flows= or scheduler=, not both (the scheduler knows its flows)")
    return Keeper(io, settings, scheduler=scheduler, clock=clock, on_orphaned=on_orphaned)
