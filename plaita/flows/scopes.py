"""One tenant's parts of a ``FlowRunner`` (``plaita.flows.engine``): its admission, checkpoints
and children, each on that tenant's store; the default tenant's made at once, another
tenant's on its first task, a bounded number kept (tenant ids come from task bodies).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from plaita.config import DEFAULT_VERSION_WAIT_S
from plaita.flows.admit import Admission
from plaita.flows.batch import CallBatcher
from plaita.flows.checkpoint import Checkpointer
from plaita.flows.children import Children
from plaita.flows.definition import FlowRegistry
from plaita.flows.handover import Handover
from plaita.flows.queued import QueuedStarts
from plaita.flows.retention import index_keep_s
from plaita.store.executions import ExecutionStore
from plaita.tasks import Task

#: Tenants whose parts (admission, checkpoints, children) one runner keeps before starting over.
MAX_TENANT_SCOPES = 1024


@dataclass(frozen=True)
class Scope:
    """One tenant's admission, checkpoints and children, each on that tenant's store."""

    admission: Admission
    checkpoints: Checkpointer
    children: Children


@dataclass(frozen=True)
class ScopeParts:
    """What every tenant's parts share: the runner's flows, hand-over, limits and batcher."""

    flows: FlowRegistry
    handover: Handover
    max_state_bytes: int
    retention_s: int
    clock: Callable[[], float]
    batcher: CallBatcher | None
    #: How long a start asking for a version no live worker runs waits (``plaita.flows.queued``).
    version_wait_s: float = DEFAULT_VERSION_WAIT_S


class TenantScopes:
    """The default tenant's ``Scope`` and, made on first use, every other tenant's."""

    def __init__(self, store: ExecutionStore, parts: ScopeParts) -> None:
        self._store, self._parts = store, parts
        self.default = self._new(store)
        self._others: dict[str, Scope] = {}

    def _new(self, store: ExecutionStore) -> Scope:
        p = self._parts
        queued = QueuedStarts(store, version_wait_s=p.version_wait_s, retention_s=p.retention_s, clock=p.clock)
        admission = Admission(
            p.flows, store, p.handover, max_state_bytes=p.max_state_bytes, clock=p.clock, queued=queued
        )
        children = Children(store)
        admission.on_child, admission.batcher = children.noted, p.batcher
        keep = index_keep_s(p.flows, p.retention_s)
        checkpoints = Checkpointer(store, retention_s=p.retention_s, batcher=p.batcher, index_keep_s=keep)
        return Scope(admission, checkpoints, children)

    def of(self, task: Task) -> Scope:
        """The parts working on ``task``'s tenant's store (its body's ``tenant_id``)."""
        if not task.tenant_id:
            return self.default
        store = self._store.of(task)
        scope = self._others.get(store.ks.ns)
        if scope is None:
            if len(self._others) >= MAX_TENANT_SCOPES:  # bounded: tenant ids come from task bodies
                self._others.clear()
            scope = self._others[store.ks.ns] = self._new(store)
        return scope
