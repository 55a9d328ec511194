"""``MemoryIO``: an ``ExecutionIO`` (``plaita.flows.io``) that records the engine's decisions.

It is not a Redis fake: no leases, no scripts, no keys, no expiry, no streams. It keeps the last
document written per execution, so the engine reads back what it wrote, and it records, in
order, what the runner asked for: every create, checkpoint and reopen (``writes``: status,
document, deadline, staged writes), every task it enqueued (``enqueued``), every cancel flag it
set, every event a step published. Tests of the engine's decisions (what is written after a
step, a suspension, a retry, a spawn) run on it without a server; every Redis behaviour is
tested on real servers through ``plaita.store.executions.execution_io.StoreIO``.

What it cannot decide it refuses (``ConfigError``): flow limits and a queued start's version
wait need the real adapter.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from plaita.errors import ConfigError
from plaita.tasks import Task

if TYPE_CHECKING:
    from plaita.store.executions.flow_limits import Admit, FlowLimitStore
    from plaita.store.executions.store import Staged, UnreadableExecution


#: A published event kept per execution and name (``MemoryIO.published``).
_MAX_EVENT_NAMES = 1000


@dataclass(frozen=True)
class Written:
    """One write the runner asked for."""

    #: ``create``, ``checkpoint``, ``reopen`` or ``rewrite_queued``.
    what: str
    execution_id: str
    status: str
    doc: dict[str, Any]
    deadline_s: float | None = None
    staged: tuple[Staged, ...] = ()
    #: A checkpoint the runner marked as following its own ``running`` write (``ExecutionIO.checkpoint``).
    after_running: bool = False


class _NeedsServer:
    """What ``MemoryIO`` hands out for a part it does not record: any use is a ConfigError."""

    def __init__(self, what: str) -> None:
        self._what = what

    def __getattr__(self, name: str) -> Any:
        raise ConfigError(
            f"{self._what} need a real server: test them through plaita.store.executions.execution_io.StoreIO"
        )


_VERSION_WAIT = "a queued start's version wait needs a real server: test it through StoreIO"
_FLOW_LIMITS = "flow limits need a real server: test them through plaita.store.executions.execution_io.StoreIO"


@dataclass
class _Events:
    """One task's ``ctx.publish`` target."""

    io: MemoryIO

    def publish_event(self, execution_id: str, generation: int, name: str, record_json: str, max_names: int) -> int:
        events = self.io.published.setdefault(execution_id, {})
        if name not in events and len(events) >= min(max_names, _MAX_EVENT_NAMES):
            return -1
        events[name] = json.loads(record_json)
        return 1

    def events_key(self, execution_id: str) -> str:
        return f"events of {execution_id}"


@dataclass
class _Fleet:
    """No other worker runs anything: every hand-over finds nobody to take the task."""

    handovers: dict[str, int] = field(default_factory=dict)

    def workers(self) -> list[dict[str, Any]]:
        return []

    def count_handover(self, name: str, window_s: float) -> int:
        self.handovers[name] = self.handovers.get(name, 0) + 1
        return self.handovers[name]


class MemoryIO:
    """The runner's door, in memory; ``queue`` is the name spans and hand-overs see."""

    def __init__(self, queue: str = "plaita:flow:queue") -> None:
        self._queue = queue
        #: The last document written, by execution id (seed it to resume an execution).
        self.docs: dict[str, dict[str, Any]] = {}
        #: Executions whose cancel flag is set (a test sets one; the runner sets its children's).
        self.cancelled: set[str] = set()
        #: Executions whose lease moved on: each write of theirs is refused (fenced out).
        self.fenced: set[str] = set()
        #: Every write, in order.
        self.writes: list[Written] = []
        #: Every task body enqueued (children's starts, resumes of a parent, cancels), in order.
        self.enqueued: list[dict[str, Any]] = []
        #: Each cancel flag the runner set, in order.
        self.cancels_requested: list[str] = []
        #: A spawn's children that ended, by (parent, prefix); None once the parent joined them.
        self.done: dict[tuple[str, str], set[int] | None] = {}
        #: Published events: execution id -> name -> record.
        self.published: dict[str, dict[str, Any]] = {}
        #: The dedup keys of the starts created: key -> execution id.
        self.dedup: dict[str, str] = {}
        self.fleet_view = _Fleet()
        self.closed = False

    # -- what a test reads ------------------------------------------------------------------
    def statuses(self, execution_id: str) -> list[str]:
        """The statuses written for ``execution_id``, in order."""
        return [w.status for w in self.writes if w.execution_id == execution_id]

    def last(self, execution_id: str) -> Written:
        """The last write of ``execution_id``."""
        return [w for w in self.writes if w.execution_id == execution_id][-1]

    # -- ExecutionIO -------------------------------------------------------------------------
    @property
    def queue(self) -> str:
        return self._queue

    def tenant(self, task: Task) -> str | None:
        return task.tenant_id or None

    def execution_key(self, task: Task) -> str:
        return f"execution {task.execution_id}"

    def close(self) -> None:
        self.closed = True

    async def load(self, task: Task) -> tuple[dict[str, Any] | None, bool]:
        doc = self.docs.get(task.execution_id)
        return (None if doc is None else json.loads(json.dumps(doc))), task.execution_id in self.cancelled

    def parse(self, task: Task, raw: Any) -> dict[str, Any] | None:
        return None if raw is None else cast(dict[str, Any], json.loads(raw))

    async def create(self, task: Task, document: str, now_s: float, dedup: str | None) -> tuple[int, str, bool]:
        eid, cancel = task.execution_id, task.execution_id in self.cancelled
        if eid in self.fenced:
            return 0, "", cancel
        if dedup and self.dedup.get(dedup, eid) != eid:
            return 2, self.dedup[dedup], cancel
        existing = self.docs.get(eid)
        if existing is not None and existing.get("status") != "queued":
            return 3, json.dumps(existing), cancel
        self._write("create", eid, document)
        if dedup:
            self.dedup[dedup] = eid
        return 1, "", cancel

    def create_ahead(
        self, task: Task, document: str, now_s: float, dedup: str | None
    ) -> asyncio.Future[tuple[int, str, bool]] | None:
        return None  # nothing travels: every create is the task's own

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
        eid = task.execution_id
        cancel = eid in self.cancelled
        if eid in self.fenced:
            return False, False
        if status == "completed" and cancel:  # as the script: a completion is refused for a cancel
            return False, True
        self._write("checkpoint", eid, document, deadline_s, tuple(staged), after_running)
        return True, cancel

    async def reopen(self, task: Task, document: str, now_s: float, dropped: Sequence[str]) -> bool:
        if task.execution_id in self.fenced:
            return False
        self.cancelled.discard(task.execution_id)
        self._write("reopen", task.execution_id, document)
        return True

    def _write(
        self,
        what: str,
        eid: str,
        document: str,
        deadline_s: float | None = None,
        staged: tuple[Staged, ...] = (),
        after_running: bool = False,
    ) -> None:
        doc = json.loads(document)
        self.docs[eid] = doc
        self.writes.append(Written(what, eid, str(doc.get("status")), doc, deadline_s, staged, after_running))

    async def cancel_requested(self, task: Task) -> bool:
        return task.execution_id in self.cancelled

    def cancel_flags(self, tasks: Sequence[Task]) -> list[bool]:
        return [t.execution_id in self.cancelled for t in tasks]

    def for_step(self, task: Task) -> tuple[_Events, str]:
        return _Events(self), ""

    async def get(self, task: Task, execution_id: str) -> dict[str, Any] | None:
        return self.docs.get(execution_id)

    async def read_many(
        self, task: Task, execution_ids: Sequence[str]
    ) -> list[dict[str, Any] | None | UnreadableExecution]:
        return [self.docs.get(e) for e in execution_ids]

    async def enqueue(self, task: Task, bodies: Sequence[dict[str, Any]]) -> None:
        self.enqueued.extend(bodies)

    async def request_cancels(self, task: Task, execution_ids: Sequence[str]) -> None:
        self.cancelled.update(execution_ids)
        self.cancels_requested.extend(execution_ids)

    async def mark_child_done(self, task: Task, parent_id: str, prefix: str, index: int) -> int:
        done = self.done.setdefault((parent_id, prefix), set())
        if done is None:
            return -1
        done.add(index)
        return len(done)

    async def children_done(self, task: Task, parent_id: str, prefix: str) -> int:
        done = self.done.get((parent_id, prefix), set())
        return -1 if done is None else len(done)

    async def close_spawn(self, task: Task, parent_id: str, prefix: str) -> None:
        self.done[(parent_id, prefix)] = None

    # A start's queued record: a dead-lettered start ends it (recorded as a write); a version
    # wait needs the real adapter.
    async def version_wait(self, task: Task, now_s: float, ttl_s: float) -> tuple[float, int]:
        raise ConfigError(_VERSION_WAIT)

    async def forget_version_wait(self, task: Task) -> None:
        raise ConfigError(_VERSION_WAIT)

    async def rewrite_queued(self, task: Task, document: str, status: str, now_s: float, retention_s: int) -> bool:
        if task.execution_id in self.fenced:  # as the fenced script: the lease moved on, nothing written
            return False
        self._write("rewrite_queued", task.execution_id, document)
        return True

    # Flow limits need the real adapter (their scripts are what is tested).
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
        raise ConfigError(_FLOW_LIMITS)

    async def register_parking(self, flow_id: str) -> None:
        raise ConfigError(_FLOW_LIMITS)

    async def forget_parked_start(
        self, flow_id: str, member: str, *, max_concurrent: int, ttl_s: float, key: str | None
    ) -> None:
        raise ConfigError(_FLOW_LIMITS)

    async def release_flow_slot(
        self, flow_id: str, member: str, token: str, *, max_concurrent: int, ttl_s: float, key: str | None
    ) -> bool:
        raise ConfigError(_FLOW_LIMITS)

    def limit_store(self) -> FlowLimitStore:
        return cast("FlowLimitStore", _NeedsServer("flow limits"))

    async def fleet_workers(self) -> list[dict[str, Any]]:
        return self.fleet_view.workers()

    async def count_handover(self, name: str, window_s: float) -> int:
        return self.fleet_view.count_handover(name, window_s)
