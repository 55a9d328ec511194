"""``ExecutionIO``: the one door through which the flow runner reaches execution state.

The runner (``plaita.flows.runner.engine`` and what it drives: admission, checkpoints, children,
limits, hand-over) asks for what it needs by name: load, create, checkpoint, reopen, read other
executions, enqueue tasks, mark a child done, publish, take and give back flow slots, read the
registry for a hand-over, keep a queued start's record. It never holds a Redis client and never
decides how a call travels. Two adapters satisfy this protocol structurally (no import runs
upwards):

- ``plaita.store.executions.execution_io.StoreIO``: Redis, through ``ExecutionStore``. It is built once per
  runner mode and that choice fixes how every call travels: here, on the caller's thread (a
  handler thread: nothing else runs there), or from the runner's event loop (script calls
  pipelined on the loop's own connection or by one thread: the adapter's ``CallBatcher``; any
  other call on a thread of the loop's executor).
- ``plaita.flows.memory_io.MemoryIO``: no server and no Redis semantics, only the engine's
  decisions recorded (what was written after a step, a suspension, a retry, a spawn), for unit
  tests of those decisions. Every Redis behaviour is tested on real servers through ``StoreIO``.

Every call about an execution is addressed by the task it serves: the adapter picks that task's
tenant's keys. The flow-limit calls (fleet-wide across tenants) and the registry's (``fleet_workers``,
``count_handover``: no tenant's) take no task and use the runner's own store.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from plaita.tasks import Task

if TYPE_CHECKING:
    from plaita.store.executions.flow_limits import Admit, FlowLimitStore
    from plaita.store.executions.store import Staged, UnreadableExecution


#: A create's reply: (code, text, cancel requested); code 1 created, 0 fenced out, 2 the dedup
#: key started another execution (text: its id), 3 it exists (text: its stored state).
Created = tuple[int, str, bool]


class EventWriter(Protocol):
    """Where a step's ``ctx.publish`` writes (``plaita.flows.runner.events``)."""

    def publish_event(self, execution_id: str, generation: int, name: str, record_json: str, max_names: int) -> int:
        """0 fenced out, -1 too many names, -2 wrong key type, else written."""
        ...

    def events_key(self, execution_id: str) -> str:
        """The key named in an error message."""
        ...


class ExecutionIO(Protocol):
    """Every call the runner makes to execution state. Async methods may suspend (loop mode) or
    run to their end at once (thread mode); sync ones are cheap or are called off the loop."""

    @property
    def queue(self) -> str:
        """The stream the runner consumes (spans, hand-over)."""
        ...

    def tenant(self, task: Task) -> str | None:
        """The tenant ``task``'s executions belong to (what children's tasks name)."""
        ...

    def execution_key(self, task: Task) -> str:
        """The key of ``task``'s execution, for messages about it."""
        ...

    # -- the task's own execution ---------------------------------------------------------
    async def load(self, task: Task) -> tuple[dict[str, Any] | None, bool]:
        """(stored document or None, cancel requested); UnreadableExecution for a key holding none."""
        ...

    def parse(self, task: Task, raw: Any) -> dict[str, Any] | None:
        """The document in ``raw`` (a create's code 3 text); UnreadableExecution when it is none."""
        ...

    async def create(self, task: Task, document: str, now_s: float, dedup: str | None) -> Created:
        """Create the execution under the task's lease (takes a producer's queued record over)."""
        ...

    def create_ahead(
        self, task: Task, document: str, now_s: float, dedup: str | None
    ) -> asyncio.Future[Created] | None:
        """``create``, sent now from the running loop before the task runs; None when this
        adapter sends nothing ahead (thread mode, a cluster client, a tenant's first create)."""
        ...

    async def checkpoint(
        self,
        task: Task,
        document: str,
        *,
        status: str,
        now_s: float,
        deadline_s: float | None,
        retention_s: int,
        staged: Sequence[Staged],
        index_keep_s: int | None = None,
        after_running: bool = False,
    ) -> tuple[bool, bool]:
        """One fenced write of the document, its status, deadline and staged writes: (written,
        cancel requested). StagedWriteRefused when a staged write would be refused (nothing written).
        ``after_running``: this task's own last write put the execution in ``running`` (its create
        or its previous checkpoint), so a write that keeps it running has no index to move it from."""
        ...

    async def reopen(self, task: Task, document: str, now_s: float, dropped: Sequence[str]) -> bool:
        """A terminal execution back to ``running`` (a restart); False when fenced out."""
        ...

    async def cancel_requested(self, task: Task) -> bool:
        """Whether ``task``'s execution has its cancel flag set."""
        ...

    def cancel_flags(self, tasks: Sequence[Task]) -> list[bool]:
        """Each task's cancel flag (blocking: the cancel watch's own thread calls it)."""
        ...

    def for_step(self, task: Task) -> tuple[EventWriter, str]:
        """What a step of ``task`` is handed, in one call: where its ``ctx.publish`` writes
        (called from the step, wherever it runs) and the hash tag a key written with the
        execution must carry (``ctx.slot_tag``)."""
        ...

    # -- other executions: children -------------------------------------------------------
    async def get(self, task: Task, execution_id: str) -> dict[str, Any] | None:
        """Another execution of ``task``'s tenant; UnreadableExecution for a key holding none."""
        ...

    async def read_many(
        self, task: Task, execution_ids: Sequence[str]
    ) -> list[dict[str, Any] | None | UnreadableExecution]:
        """Each execution's document (None: none), an unreadable one as its error."""
        ...

    async def enqueue(self, task: Task, bodies: Sequence[dict[str, Any]]) -> None:
        """Add a task per body to its execution's partition stream."""
        ...

    async def request_cancels(self, task: Task, execution_ids: Sequence[str]) -> None:
        """Set each execution's cancel flag."""
        ...

    async def mark_child_done(self, task: Task, parent_id: str, prefix: str, index: int) -> int:
        """Add child ``index`` to its spawn's done set: how many ended, -1 once the parent joined."""
        ...

    async def children_done(self, task: Task, parent_id: str, prefix: str) -> int:
        """How many children of the spawn ended; -1 once the parent joined them."""
        ...

    async def close_spawn(self, task: Task, parent_id: str, prefix: str) -> None:
        """The parent joined: its spawn's done set becomes an expiring marker."""
        ...

    # -- the registry, as hand-over reads it (``plaita.flows.runner.handover``) -------------------
    async def fleet_workers(self) -> list[dict[str, Any]]:
        """Every live worker's registry entry."""
        ...

    async def count_handover(self, name: str, window_s: float) -> int:
        """Count one hand-over of task ``name``: how many in its window."""
        ...

    # -- flow limits, fleet-wide (``plaita.flows.runner.limits``) -----------------------------
    async def acquire_flow_slot(
        self,
        flow_id: str,
        member: str,
        token: str,
        *,
        max_concurrent: int,
        ttl_s: float,
        starts_per_s: float,
        burst: float,
        window: tuple[int, float] | None,
        park: tuple[float, dict[str, Any], float | None] | None,
        key: str | None,
    ) -> Admit:
        """One atomic check of every limit of the flow for ``member``: its slot and its start
        rates taken together, or it parks (``park``), or is refused (``Admit``)."""
        ...

    async def register_parking(self, flow_id: str) -> None:
        """Note that ``flow_id`` parks starts (before its first park), where a cancel looks."""
        ...

    async def forget_parked_start(
        self, flow_id: str, member: str, *, max_concurrent: int, ttl_s: float, key: str | None
    ) -> None:
        """``member``'s start waits no more: out of the parked starts, a slot reserved for it freed."""
        ...

    async def release_flow_slot(
        self, flow_id: str, member: str, token: str, *, max_concurrent: int, ttl_s: float, key: str | None
    ) -> bool:
        """Give ``member``'s slot back if ``token`` still holds it (the oldest parked start takes it)."""
        ...

    # -- a start's queued record, the producer's (``plaita.flows.runner.queued``) -----------------
    async def version_wait(self, task: Task, now_s: float, ttl_s: float) -> tuple[float, int]:
        """Count one more hand-back of ``task``'s start waiting for a version: (since when it
        waits, how many times), kept ``ttl_s``."""
        ...

    async def forget_version_wait(self, task: Task) -> None:
        """The version wait of ``task``'s start is over: a requeue from the DLQ waits afresh."""
        ...

    async def rewrite_queued(self, task: Task, document: str, status: str, now_s: float, retention_s: int) -> bool:
        """Rewrite ``task``'s queued record under its lease (fenced), with ``status``; False when
        it is no longer queued or the lease moved on."""
        ...

    def limit_store(self) -> FlowLimitStore:
        """Flow slots and parked starts, for the limits' own renewer thread (it renews the slots
        held and sweeps the parked starts there, off any loop: ``plaita.flows.runner.limits``)."""
        ...

    def close(self) -> None:
        """Send what is queued, then stop sending (call once no task runs)."""
        ...
