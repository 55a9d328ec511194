"""``StoreIO``: the flow runner's door (``plaita.flows.io.ExecutionIO``) onto Redis.

Built once per runner mode, and that choice fixes how every call travels:

- ``here=True`` (the runner called as ``runner(task)`` on a handler thread): every call runs on
  the caller's thread, to its end; nothing else runs there, and no event loop does.
- ``here=False`` (``await runner.run_async(task)`` on the worker's event loop): a script call
  (create, checkpoint) goes to a ``CallBatcher`` (``plaita.store.executions.batch``: the loop's own
  connection, or one thread pipelining the calls of every execution), or, on a cluster client
  whose pipeline would split them by slot, to an offload thread of its own; any other call
  (reads, enqueues, a blocking helper of the runner) goes to an offload thread
  (``asyncio.to_thread``), so the loop is never blocked.

Every call is addressed by the task it serves: ``ExecutionStore.of(task)`` picks its tenant.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

from plaita.store.calls import ScriptCall, batchable
from plaita.store.executions import fanout
from plaita.store.executions.batch import CallBatcher
from plaita.store.executions.flow_limits import FlowLimitStore
from plaita.store.executions.store import ExecutionStore, Staged, UnreadableExecution
from plaita.store.fleet import FleetView
from plaita.tasks import Task

T = TypeVar("T")


class StoreIO:
    """``ExecutionIO`` on ``store``; ``here`` chooses how calls travel (see the module)."""

    def __init__(self, store: ExecutionStore, *, here: bool) -> None:
        self._store = store
        self._here = here
        #: Loop mode on a single server's client: script calls of concurrent executions share round trips.
        self._batcher = CallBatcher() if not here and batchable(store.client) else None
        self._limits: FlowLimitStore | None = None

    # -- how calls travel: decided once, here ---------------------------------------------
    async def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        if self._here:
            return fn(*args, **kwargs)
        return await asyncio.to_thread(fn, *args, **kwargs)

    async def _send(self, call: ScriptCall) -> Any:
        if self._here:
            return call.run()
        if self._batcher is None:
            return await asyncio.to_thread(call.run)
        return await self._batcher.run(call)

    async def blocking(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await self._call(fn, *args, **kwargs)

    def close(self) -> None:
        if self._batcher is not None:
            self._batcher.stop()

    # -- names ----------------------------------------------------------------------------
    @property
    def queue(self) -> str:
        return self._store.ks.queue

    def slot_tag(self, execution_id: str) -> str:
        return self._store.ks.slot_tag(execution_id)

    def tenant(self, task: Task) -> str | None:
        return self._store.of(task).ks.tenant

    def execution_key(self, task: Task) -> str:
        return self._store.of(task).ks.execution_key(task.execution_id)

    # -- the task's own execution ---------------------------------------------------------
    async def load(self, task: Task) -> tuple[dict[str, Any] | None, bool]:
        return await self._call(self._store.of(task).load, task.execution_id)

    def parse(self, task: Task, raw: Any) -> dict[str, Any] | None:
        return self._store.of(task).parse(task.execution_id, raw)

    async def create(self, task: Task, document: str, now_s: float, dedup: str | None) -> tuple[int, str, bool]:
        store, eid, generation = self._store.of(task), task.execution_id, task.fencing_token
        if not store.registered:  # a tenant's first create registers the tenant first
            return await self._call(store.create, eid, generation, document, now_s, dedup)
        reply = await self._send(store.create_call(eid, generation, document, now_s, dedup))
        return cast(tuple[int, str, bool], reply)

    def create_ahead(
        self, task: Task, document: str, now_s: float, dedup: str | None
    ) -> asyncio.Future[tuple[int, str, bool]] | None:
        store = self._store.of(task)
        if self._batcher is None or not store.registered:
            return None
        call = store.create_call(task.execution_id, task.fencing_token, document, now_s, dedup)
        return asyncio.ensure_future(self._batcher.run(call))

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
    ) -> tuple[bool, bool]:
        call = self._store.of(task).checkpoint_call(
            task.execution_id,
            task.fencing_token,
            document,
            status=status,
            now_s=now_s,
            deadline_s=deadline_s,
            retention_s=retention_s,
            index_keep_s=index_keep_s,
            staged=staged,
        )
        return cast(tuple[bool, bool], await self._send(call))

    async def reopen(self, task: Task, document: str, now_s: float, dropped: Sequence[str]) -> bool:
        store = self._store.of(task)
        return await self._call(store.reopen, task.execution_id, task.fencing_token, document, now_s, dropped)

    async def cancel_requested(self, task: Task) -> bool:
        flags = await self._call(self._store.of(task).cancel_requested_many, [task.execution_id])
        return flags[0]

    def cancel_flags(self, tasks: Sequence[Task]) -> list[bool]:
        # One MGET per tenant among them (each tenant's cancel flags are its own keys).
        by_ns: dict[str, tuple[ExecutionStore, list[int]]] = {}
        for i, task in enumerate(tasks):
            store = self._store.of(task)
            by_ns.setdefault(store.ks.ns, (store, []))[1].append(i)
        flags = [False] * len(tasks)
        for store, indexes in by_ns.values():
            found = store.cancel_requested_many([tasks[i].execution_id for i in indexes])
            for i, flag in zip(indexes, found, strict=True):
                flags[i] = flag
        return flags

    def events(self, task: Task) -> ExecutionStore:
        return self._store.of(task)

    # -- other executions: children -------------------------------------------------------
    async def get(self, task: Task, execution_id: str) -> dict[str, Any] | None:
        return await self._call(self._store.of(task).get, execution_id)

    async def read_many(
        self, task: Task, execution_ids: Sequence[str]
    ) -> list[dict[str, Any] | None | UnreadableExecution]:
        return await self._call(self._store.of(task).read_many, execution_ids)

    async def enqueue(self, task: Task, bodies: Sequence[dict[str, Any]]) -> None:
        if bodies:
            await self._call(self._store.of(task).enqueue_tasks, bodies)

    async def request_cancels(self, task: Task, execution_ids: Sequence[str]) -> None:
        if execution_ids:
            await self._call(self._store.of(task).request_cancels, execution_ids)

    async def mark_child_done(self, task: Task, parent_id: str, prefix: str, index: int) -> int:
        store = self._store.of(task)
        return await self._call(fanout.mark_done, store.client, store.ks, parent_id, prefix, index)

    async def children_done(self, task: Task, parent_id: str, prefix: str) -> int:
        store = self._store.of(task)
        return await self._call(fanout.done_count, store.client, store.ks, parent_id, prefix)

    async def close_spawn(self, task: Task, parent_id: str, prefix: str) -> None:
        store = self._store.of(task)
        await self._call(fanout.close_spawn, store.client, store.ks, parent_id, prefix)

    # -- what the runner's blocking helpers are given ---------------------------------------
    def queued(self, task: Task) -> ExecutionStore:
        return self._store.of(task)

    def limit_store(self) -> FlowLimitStore:
        if self._limits is None:
            self._limits = FlowLimitStore(self._store.client, self._store.ks)
        return self._limits

    def fleet(self) -> FleetView:
        return FleetView(self._store.client)
