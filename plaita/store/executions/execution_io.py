"""``StoreIO``: the flow runner's door (``plaita.flows.io.ExecutionIO``) onto Redis.

Built once per runner mode, and that choice fixes how every call travels:

- ``here=True`` (the runner called as ``runner(task)`` on a handler thread): every call runs on
  the caller's thread, to its end; nothing else runs there, and no event loop does.
- ``here=False`` (``await runner.run_async(task)`` on the worker's event loop): a script call
  (create, checkpoint) goes to a ``CallBatcher`` (below: the loop's own connection,
  ``plaita.store.executions.loop_calls``, or one thread pipelining the calls of every
  execution), or, on a cluster client whose pipeline would split them by slot, to an offload
  thread of its own; any other call (reads, enqueues, flow slots, the registry) goes to
  an offload thread (``asyncio.to_thread``), so the loop is never blocked.

Every call about an execution is addressed by the task it serves: its body's tenant picks the
store (the default tenant's is this adapter's own, no call). The flow-limit and registry calls
take no task: flow limits are fleet-wide across tenants, the registry is no tenant's.

The writes of a step are built here, beside the adapter that sends them: ``create_call`` and
``checkpoint_call`` (one fenced EVALSHA each, with the parser of its reply), so the store side of
a create or a checkpoint is this module alone. ``create_now`` and ``checkpoint_now`` send the
same calls at once, for tools and tests that hold a store and no runner.

The batcher. With ``await runner.run_async(task)`` every create and checkpoint would otherwise be
a thread hop of its own (``asyncio.to_thread``) and a round trip of its own. ``CallBatcher`` sends
them over the loop's own connection when it can serve the client; else the loop queues the call
and awaits a future, and one thread (``plaita.store.executions.thread_calls``) takes whatever is
queued, sends it as one pipeline (``plaita.store.calls.run_calls``: each call is still one
atomic, fenced script, with its own reply or error) and resolves the futures with one hand-back
per loop. While one batch is on the wire the next one gathers: at ``--concurrency`` N up to N
calls share a round trip (and, with ``appendfsync always``, the server's fsync), and at 1 a call
costs what it did.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

import redis

from plaita.store import scripts
from plaita.store.calls import ScriptCall, batchable
from plaita.store.executions import fanout
from plaita.store.executions.execution_docs import reply_text
from plaita.store.executions.flow_limits import Admit, FlowLimitStore
from plaita.store.executions.loop_calls import LoopCalls, LoopUnsupported, servable
from plaita.store.executions.queued import QUEUED
from plaita.store.executions.staged import ExecutionKeyError, StagedWriteRefused
from plaita.store.executions.staged import plan as plan_staged
from plaita.store.executions.store import (
    FLAG_TTL_S,
    STATUSES,
    TERMINAL,
    ExecutionStore,
    Staged,
    UnreadableExecution,
)
from plaita.store.executions.thread_calls import ThreadCalls
from plaita.store.fleet import FleetView
from plaita.store.keyspace import Keyspace
from plaita.tasks import Task

logger = logging.getLogger(__name__)

T = TypeVar("T")

CHECKPOINT = scripts.script("checkpoint_execution")
#: A still-running step's checkpoint by the task that indexed it running (``checkpoint_call``).
CHECKPOINT_RUNNING = scripts.script("checkpoint_running")
CREATE = scripts.script("create_execution")


def index_score(now_s: float, status: str) -> str:
    """The status index score of an update at ``now_s`` to ``status``: for ``running``, its whole
    second (rounded down); else ``now_s`` itself.

    Why whole seconds for the running index: it holds the executions running now, at most a few
    hundred, so it is mostly a listpack (up to 128 members), and every ZADD into a listpack parses
    each member's score to find its place. A float score such as ``repr(time.time())`` takes
    glibc's slow exact ``strtod`` each time, an integer none: redis-server spent 25 % fewer
    instructions on a 3-step execution's checkpoints (callgrind, 566k -> 426k with the Lua
    changes of the same commit), and a running execution is written once per step. An entry then
    reads at most a second older than its update: the keeper's stale-running scan (a grace of
    seconds to minutes, and the lease must be gone too) moves by that second, and the listing
    orders running executions by the second of their last step, ties by tenant and id
    (``index_scan.Position``). The other indexes are written once per execution (large ones are
    skip lists, which parse nothing): exact.
    """
    return str(math.floor(now_s)) if status == "running" else repr(now_s)


def create_call(
    client: redis.Redis,
    ks: Keyspace,
    execution_id: str,
    generation: int,
    state_json: str,
    now_s: float,
    dedup: str | None,
) -> ScriptCall:
    """Create the state under the lease, as a call to send (alone or in a batch): its reply
    (code, text, cancel requested), see the CREATE script; only once the store's tenant is
    registered (``ExecutionStore.register``). ExecutionKeyError (nothing written) when one of its
    keys holds the wrong type."""
    p = ks.partition_of(execution_id)
    lease, fence, state, cancel, _ = ks.own_keys(execution_id)
    keys = [
        lease,
        fence,
        state,
        ks.status_key(p, "running"),
        cancel,
        ks.status_key(p, QUEUED),  # a producer's queued record is taken over,
        ks.status_key(p, "error"),  # or its end when its start was dead-lettered
    ]
    if dedup:
        keys.append(ks.dedup_key(p, dedup))
    args = [generation, state_json, index_score(now_s, "running"), execution_id, FLAG_TTL_S]
    return ScriptCall(client, CREATE, keys, args, _created)


def _created(reply: list[Any]) -> tuple[int, str, bool]:
    """CREATE's reply as (code, text, cancel requested), or the wrong-typed key it names."""
    code, text, cancel = reply
    if int(code) == 4:
        raise ExecutionKeyError(reply_text(text), "holds the wrong type")
    return int(code), reply_text(text), int(cancel) == 1


def checkpoint_call(
    client: redis.Redis,
    ks: Keyspace,
    execution_id: str,
    generation: int,
    state_json: str,
    *,
    status: str,
    now_s: float,
    deadline_s: float | None = None,
    retention_s: int = 0,
    index_keep_s: int | None = None,
    staged: Sequence[Staged] = (),
    after_running: bool = False,
) -> ScriptCall:
    """One fenced write of the state, index, deadline and staged writes, as a call to send: its
    reply (written, cancel requested). A ``completed`` state is refused while the cancel flag is
    set: (False, True), nothing written. All or nothing: StagedWriteRefused for a staged write
    Redis would refuse (checked here, before anything is sent, or by the script against the
    key's current type and value), ExecutionKeyError for a wrong-typed index; ValueError for a
    deadline that is no finite time. ``index_keep_s``: the status index drops entries older than
    that (0: none; None: as ``retention_s``), so a flow kept longer than this one stays listed
    (``Flow.retention_s``); or older than the longest keep another writer used within that keep
    (the index keeps key: workers of other flows in the same tenant).

    ``after_running``: the caller's task put the execution in the running index itself (its
    create, or its previous checkpoint) and has held the lease since. A ``running`` write with
    no deadline and no staged writes then goes through ``checkpoint_running``, which touches the
    running index only: 4 commands and 5 keys instead of 10 and 11 (redis-server: a third fewer
    instructions per such checkpoint)."""
    if deadline_s is not None and not math.isfinite(deadline_s):
        raise ValueError(f"checkpoint deadline must be a finite time, got {deadline_s!r}")
    p = ks.partition_of(execution_id)
    lease, fence, state, cancel, events = ks.own_keys(execution_id)
    deadlines, statuses, keeps = _partition_keys(ks, p)
    if after_running and status == "running" and deadline_s is None and not staged:
        slim: list[Any] = [generation, state_json, index_score(now_s, status), execution_id]
        return ScriptCall(
            client, CHECKPOINT_RUNNING, [lease, fence, state, cancel, statuses[_RUNNING]], slim, _checkpointed
        )
    keys = [lease, fence, state, cancel, deadlines, *statuses]
    if staged:
        keys += [s.key for s in staged]
    keys.append(events)  # expires with the state once terminal
    if status in TERMINAL:  # the trim keeps what any writer of this partition's index owes
        keys.append(keeps)
    args: list[Any] = [
        generation,
        state_json,
        STATUSES.index(status) + 1,
        index_score(now_s, status),
        execution_id,
        "" if deadline_s is None else repr(deadline_s),
        int(retention_s) if status in TERMINAL else 0,  # EXPIRE takes it as sent: "86400", never "86400.0"
        len(staged),
        *plan_staged(staged),
    ]
    if index_keep_s is not None and status in TERMINAL:  # how long its index keeps entries
        args.append(index_keep_s)
    return ScriptCall(client, CHECKPOINT, keys, args, _checkpointed)


#: Where the running index is among ``_partition_keys``' status indexes.
_RUNNING = STATUSES.index("running")


@functools.lru_cache(maxsize=1024)
def _partition_keys(ks: Keyspace, p: int) -> tuple[str, tuple[str, ...], str]:
    """Partition ``p``'s keys every checkpoint names (deadlines, the status indexes in ``STATUSES``
    order, the index keeps), built once per keyspace (one per tenant) and partition."""
    return ks.deadlines_key(p), tuple(ks.status_key(p, s) for s in STATUSES), ks.index_keeps_key(p)


def _checkpointed(reply: list[Any]) -> tuple[bool, bool]:
    """CHECKPOINT's reply as (written, cancel requested), or the refusal it names. (False, True):
    nothing written, a ``completed`` result refused because the cancel flag is set."""
    code = int(reply[0])
    if code == 2:
        raise StagedWriteRefused(reply_text(reply[1]), reply_text(reply[2]))
    if code == 3:
        raise ExecutionKeyError(reply_text(reply[1]), reply_text(reply[2]))
    return code == 1, code in (1, 4) and int(reply[1]) == 1


def create_now(
    store: ExecutionStore, execution_id: str, generation: int, state_json: str, now_s: float, dedup: str | None
) -> tuple[int, str, bool]:
    """``create_call`` on ``store``, sent now (its tenant registered first)."""
    store.register()
    return cast(
        tuple[int, str, bool],
        create_call(store.client, store.ks, execution_id, generation, state_json, now_s, dedup).run(),
    )


def checkpoint_now(
    store: ExecutionStore, execution_id: str, generation: int, state_json: str, **kw: Any
) -> tuple[bool, bool]:
    """``checkpoint_call`` on ``store``, sent now."""
    return cast(
        tuple[bool, bool], checkpoint_call(store.client, store.ks, execution_id, generation, state_json, **kw).run()
    )


class StoreIO:
    """``ExecutionIO`` on ``store``; ``here`` chooses how calls travel (see the module)."""

    def __init__(self, store: ExecutionStore, *, here: bool) -> None:
        self._store = store
        self._here = here
        #: Loop mode on a single server's client: script calls of concurrent executions share round trips.
        self._batcher = CallBatcher() if not here and batchable(store.client) else None
        self._limits: FlowLimitStore | None = None
        self._fleet = FleetView(store.client)

    def _of(self, task: Task) -> ExecutionStore:
        """The store of ``task``'s tenant (the default tenant's: this adapter's own, no call)."""
        tenant = task.tenant_id
        return self._store.for_tenant(tenant) if tenant else self._store

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
            return await self._call(create_now, store, eid, generation, document, now_s, dedup)
        reply = await self._send(create_call(store.client, store.ks, eid, generation, document, now_s, dedup))
        return cast(tuple[int, str, bool], reply)

    def create_ahead(
        self, task: Task, document: str, now_s: float, dedup: str | None
    ) -> asyncio.Future[tuple[int, str, bool]] | None:
        store = self._of(task)
        if self._batcher is None or not store.registered:
            return None
        call = create_call(store.client, store.ks, task.execution_id, task.fencing_token, document, now_s, dedup)
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
        after_running: bool = False,
    ) -> tuple[bool, bool]:
        store = self._of(task)
        call = checkpoint_call(
            store.client,
            store.ks,
            task.execution_id,
            task.fencing_token,
            document,
            status=status,
            now_s=now_s,
            deadline_s=deadline_s,
            retention_s=retention_s,
            index_keep_s=index_keep_s,
            staged=staged,
            after_running=after_running,
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

    # -- a start's queued record ----------------------------------------------------------------
    async def version_wait(self, task: Task, now_s: float, ttl_s: float) -> tuple[float, int]:
        return await self._call(self._of(task).version_wait, task.execution_id, now_s, ttl_s)

    async def forget_version_wait(self, task: Task) -> None:
        await self._call(self._of(task).forget_version_wait, task.execution_id)

    async def rewrite_queued(self, task: Task, document: str, status: str, now_s: float, retention_s: int) -> bool:
        store, eid, token = self._of(task), task.execution_id, task.fencing_token
        return await self._call(store.rewrite_queued, eid, token, document, status, now_s, retention_s)

    # -- flow limits -----------------------------------------------------------------------
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
        return await self._call(
            self.limit_store().acquire,
            flow_id,
            member,
            token,
            max_concurrent=max_concurrent,
            ttl_s=ttl_s,
            starts_per_s=starts_per_s,
            burst=burst,
            window=window,
            park=park,
            key=key,
        )

    async def register_parking(self, flow_id: str) -> None:
        await self._call(self.limit_store().register_parking, flow_id)

    async def forget_parked_start(
        self, flow_id: str, member: str, *, max_concurrent: int, ttl_s: float, key: str | None
    ) -> None:
        limits = self.limit_store()
        await self._call(limits.forget, flow_id, member, max_concurrent=max_concurrent, ttl_s=ttl_s, key=key)

    async def release_flow_slot(
        self, flow_id: str, member: str, token: str, *, max_concurrent: int, ttl_s: float, key: str | None
    ) -> bool:
        limits = self.limit_store()
        return await self._call(
            limits.release, flow_id, member, token, max_concurrent=max_concurrent, ttl_s=ttl_s, key=key
        )

    def limit_store(self) -> FlowLimitStore:
        if self._limits is None:
            self._limits = FlowLimitStore(self._store.client, self._store.ks)
        return self._limits

    # -- the registry, as hand-over reads it ------------------------------------------------
    async def fleet_workers(self) -> list[dict[str, Any]]:
        return await self._call(self._fleet.workers)

    async def count_handover(self, name: str, window_s: float) -> int:
        return await self._call(self._fleet.count_handover, name, window_s)


class CallBatcher:
    """Script calls sent in batches: over the loop's own connection when it can serve the
    client (``loop_connection``, ``plaita.store.executions.loop_calls``: no thread hand-offs,
    batches pipelined), else by one daemon thread (``plaita.store.executions.thread_calls``)."""

    def __init__(self, *, loop_connection: bool = True) -> None:
        self._loop_calls = LoopCalls() if loop_connection else None
        self.threaded = ThreadCalls()

    async def run(self, call: ScriptCall) -> Any:
        """``call.run()``, sent with whatever else is queued; raises what the call raised."""
        if self._loop_calls is not None and servable(call.client):
            try:
                return await self._loop_calls.run(call)
            except LoopUnsupported as exc:  # nothing was sent: the thread sends it, and every later call
                if self._loop_calls is not None:  # once: the calls that met it at the same time say nothing
                    logger.warning("flow runner: Redis calls go through a thread, not the loop connection: %s", exc)
                    self._loop_calls = None
        return await self.threaded.run(call)

    def stop(self) -> None:
        """Send what is queued, then end the thread (and close the loop connections)."""
        if self._loop_calls is not None:
            self._loop_calls.stop()
        self.threaded.stop()
