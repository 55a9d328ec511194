"""``StoreIO``: the flow runner's door (``plaita.flows.io.ExecutionIO``) onto Redis.

Built once per runner mode, and that choice fixes how every call travels:

- ``here=True`` (the runner called as ``runner(task)`` on a handler thread): every call runs on
  the caller's thread, to its end; nothing else runs there, and no event loop does.
- ``here=False`` (``await runner.run_async(task)`` on the worker's event loop): a script call
  (create, checkpoint) goes to a ``CallBatcher`` (below: the loop's own connection,
  ``plaita.store.executions.loop_calls``, or one thread pipelining the calls of every
  execution), or, on a cluster client whose pipeline would split them by slot, to an offload
  thread of its own; any other call (reads, enqueues, a blocking helper of the runner) goes to
  an offload thread (``asyncio.to_thread``), so the loop is never blocked.

Every call is addressed by the task it serves: ``ExecutionStore.of(task)`` picks its tenant.

The batcher. With ``await runner.run_async(task)`` every create and checkpoint would otherwise be
a thread hop of its own (``asyncio.to_thread``) and a round trip of its own. ``CallBatcher`` sends
them over the loop's own connection when it can serve the client; else the loop queues the call
and awaits a future, and one thread takes whatever is queued, sends it as one pipeline
(``plaita.store.calls.run_calls``: each call is still one atomic, fenced script, with its own
reply or error) and resolves the futures with one hand-back per loop. While one batch is on
the wire the next one gathers: at ``--concurrency`` N up to N calls share a round trip (and,
with ``appendfsync always``, the server's fsync), and at 1 a call costs what it did.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

from plaita.store.calls import ScriptCall, batchable, run_calls
from plaita.store.executions import fanout
from plaita.store.executions.flow_limits import FlowLimitStore
from plaita.store.executions.loop_calls import LoopCalls, LoopUnsupported, resolve, servable
from plaita.store.executions.store import ExecutionStore, Staged, UnreadableExecution
from plaita.store.fleet import FleetView
from plaita.tasks import Task

logger = logging.getLogger(__name__)

T = TypeVar("T")


class StoreIO:
    """``ExecutionIO`` on ``store``; ``here`` chooses how calls travel (see the module)."""

    def __init__(self, store: ExecutionStore, *, here: bool) -> None:
        self._store = store
        self._here = here
        #: Loop mode on a single server's client: script calls of concurrent executions share round trips.
        self._batcher = CallBatcher() if not here and batchable(store.client) else None
        self._limits: FlowLimitStore | None = None

    def _of(self, task: Task) -> ExecutionStore:
        """The store of ``task``'s tenant."""
        return self._store.of(task)

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

    def tenant(self, task: Task) -> str | None:
        return self._of(task).ks.tenant

    def execution_key(self, task: Task) -> str:
        return self._of(task).ks.execution_key(task.execution_id)

    # -- the task's own execution ---------------------------------------------------------
    async def load(self, task: Task) -> tuple[dict[str, Any] | None, bool]:
        return await self._call(self._of(task).load, task.execution_id)

    def parse(self, task: Task, raw: Any) -> dict[str, Any] | None:
        return self._of(task).parse(task.execution_id, raw)

    async def create(self, task: Task, document: str, now_s: float, dedup: str | None) -> tuple[int, str, bool]:
        store, eid, generation = self._of(task), task.execution_id, task.fencing_token
        if not store.registered:  # a tenant's first create registers the tenant first
            return await self._call(store.create, eid, generation, document, now_s, dedup)
        reply = await self._send(store.create_call(eid, generation, document, now_s, dedup))
        return cast(tuple[int, str, bool], reply)

    def create_ahead(
        self, task: Task, document: str, now_s: float, dedup: str | None
    ) -> asyncio.Future[tuple[int, str, bool]] | None:
        store = self._of(task)
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
        call = self._of(task).checkpoint_call(
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
        store = self._of(task)
        return await self._call(store.reopen, task.execution_id, task.fencing_token, document, now_s, dropped)

    async def cancel_requested(self, task: Task) -> bool:
        flags = await self._call(self._of(task).cancel_requested_many, [task.execution_id])
        return flags[0]

    def cancel_flags(self, tasks: Sequence[Task]) -> list[bool]:
        # One MGET per tenant among them (each tenant's cancel flags are its own keys).
        by_ns: dict[str, tuple[ExecutionStore, list[int]]] = {}
        for i, task in enumerate(tasks):
            store = self._of(task)
            by_ns.setdefault(store.ks.ns, (store, []))[1].append(i)
        flags = [False] * len(tasks)
        for store, indexes in by_ns.values():
            found = store.cancel_requested_many([tasks[i].execution_id for i in indexes])
            for i, flag in zip(indexes, found, strict=True):
                flags[i] = flag
        return flags

    def for_step(self, task: Task) -> tuple[ExecutionStore, str]:
        return self._of(task), self._store.ks.slot_tag(task.execution_id)

    # -- other executions: children -------------------------------------------------------
    async def get(self, task: Task, execution_id: str) -> dict[str, Any] | None:
        return await self._call(self._of(task).get, execution_id)

    async def read_many(
        self, task: Task, execution_ids: Sequence[str]
    ) -> list[dict[str, Any] | None | UnreadableExecution]:
        return await self._call(self._of(task).read_many, execution_ids)

    async def enqueue(self, task: Task, bodies: Sequence[dict[str, Any]]) -> None:
        if bodies:
            await self._call(self._of(task).enqueue_tasks, bodies)

    async def request_cancels(self, task: Task, execution_ids: Sequence[str]) -> None:
        if execution_ids:
            await self._call(self._of(task).request_cancels, execution_ids)

    async def mark_child_done(self, task: Task, parent_id: str, prefix: str, index: int) -> int:
        store = self._of(task)
        return await self._call(fanout.mark_done, store.client, store.ks, parent_id, prefix, index)

    async def children_done(self, task: Task, parent_id: str, prefix: str) -> int:
        store = self._of(task)
        return await self._call(fanout.done_count, store.client, store.ks, parent_id, prefix)

    async def close_spawn(self, task: Task, parent_id: str, prefix: str) -> None:
        store = self._of(task)
        await self._call(fanout.close_spawn, store.client, store.ks, parent_id, prefix)

    # -- what the runner's blocking helpers are given ---------------------------------------
    def queued(self, task: Task) -> ExecutionStore:
        return self._of(task)

    def limit_store(self) -> FlowLimitStore:
        if self._limits is None:
            self._limits = FlowLimitStore(self._store.client, self._store.ks)
        return self._limits

    def fleet(self) -> FleetView:
        return FleetView(self._store.client)


#: Calls one round trip carries at most (more wait for the next one).
MAX_BATCH = 256

_Queued = tuple[ScriptCall, asyncio.Future[Any], asyncio.AbstractEventLoop]


class CallBatcher:
    """One daemon thread (started with the first call) sending queued calls in batches; the
    calls of a client a loop connection can serve go over that instead (``loop_connection``,
    ``plaita.store.executions.loop_calls``: no thread hand-offs, batches pipelined)."""

    def __init__(self, *, loop_connection: bool = True) -> None:
        self._loop_calls = LoopCalls() if loop_connection else None
        self._cond = threading.Condition()
        self._queued: list[_Queued] = []
        self._stopped = False
        self._thread: threading.Thread | None = None

    async def run(self, call: ScriptCall) -> Any:
        """``call.run()``, sent with whatever else is queued; raises what the call raised."""
        if self._loop_calls is not None and servable(call.client):
            try:
                return await self._loop_calls.run(call)
            except LoopUnsupported as exc:  # nothing was sent: the thread sends it, and every later call
                if self._loop_calls is not None:  # once: the calls that met it at the same time say nothing
                    logger.warning("flow runner: Redis calls go through a thread, not the loop connection: %s", exc)
                    self._loop_calls = None
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        with self._cond:
            if self._stopped:
                raise RuntimeError("flow runner closed: no more Redis calls")
            self._queued.append((call, future, loop))
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="plaita-flow-io", daemon=True)
                self._thread.start()
            self._cond.notify()
        return await future

    def stop(self) -> None:
        """Send what is queued, then end the thread (and close the loop connections)."""
        if self._loop_calls is not None:
            self._loop_calls.stop()
        with self._cond:
            self._stopped = True
            self._cond.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(2.0)

    def _take(self) -> list[_Queued] | None:
        with self._cond:
            while not self._queued and not self._stopped:
                self._cond.wait()
            if not self._queued:
                return None
            batch, self._queued = self._queued[:MAX_BATCH], self._queued[MAX_BATCH:]
            return batch

    def _serve(self) -> None:
        while (batch := self._take()) is not None:
            outcomes = _send(batch)
            by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], Any]]] = {}
            for (_, future, loop), outcome in zip(batch, outcomes, strict=True):
                by_loop.setdefault(loop, []).append((future, outcome))
            for loop, settled in by_loop.items():
                _hand_back(loop, settled)


def _send(batch: list[_Queued]) -> list[Any]:
    """Each call's outcome (a reply, or the exception it ended in), one pipeline per client."""
    outcomes: list[Any] = [None] * len(batch)
    by_client: dict[int, list[int]] = {}
    for i, (call, _, _) in enumerate(batch):
        by_client.setdefault(id(call.client), []).append(i)
    for indexes in by_client.values():
        calls = [batch[i][0] for i in indexes]
        try:
            results = run_calls(calls[0].client, calls)
        except BaseException as exc:  # noqa: B036 - every waiting execution must hear of it
            results = [exc] * len(calls)
        for i, result in zip(indexes, results, strict=True):
            outcomes[i] = result
    return outcomes


def _hand_back(loop: asyncio.AbstractEventLoop, settled: list[tuple[asyncio.Future[Any], Any]]) -> None:
    with contextlib.suppress(RuntimeError):  # a closed loop: its worker is exiting, nobody awaits these
        loop.call_soon_threadsafe(_resolve, settled)


def _resolve(settled: list[tuple[asyncio.Future[Any], Any]]) -> None:
    for future, outcome in settled:
        resolve(future, outcome)
