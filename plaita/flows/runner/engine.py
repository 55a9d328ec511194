"""``FlowRunner``: the worker handler that advances executions one checkpointed step at a time.

The worker gives every task the execution's lease (generation ``task.fencing_token``) before
the handler runs, so one execution never advances on two workers at once.

One task, in this file's order: ``plaita.flows.runner.admit`` turns it into a ``Run`` (or a no-op:
every task is safe to deliver twice); a flow with fleet-wide limits first takes one of its slots
(``plaita.flows.runner.limits``: a start before admission, a resume after, given back when the task
ends; over the limit the task goes back to the queue); then ``plaita.flows.runner.steploop`` runs
its steps while the execution is running, one checkpoint after each.

Every call to execution state goes through one door, ``ExecutionIO`` (``plaita.flows.io``):
the runner holds two, one per mode (a handler thread's, the event loop's), chosen once here;
how a call travels is the adapter's business (``plaita.store.executions.execution_io``).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterable
from typing import Any

from plaita.clock import wall_s
from plaita.config import DEFAULT_LEASE_TTL_S, DEFAULT_VERSION_WAIT_S
from plaita.errors import ConfigError, NotForThisWorker
from plaita.flows.io import ExecutionIO
from plaita.flows.model import bodies as model
from plaita.flows.model.bodies import TRACEPARENT
from plaita.flows.model.definition import Flow, FlowRegistry
from plaita.flows.retention import index_keep_s
from plaita.flows.runner.admit import Admission, Run
from plaita.flows.runner.checkpoint import Checkpointer
from plaita.flows.runner.children import Children
from plaita.flows.runner.limits import FlowLimits
from plaita.flows.runner.stepcall import StepCaller
from plaita.flows.runner.steploop import StepLoop
from plaita.flows.runner.watch import CancelWatch
from plaita.flows.tracing import TaskTrace, Tracing, joined
from plaita.runtime.observer import ExecutionObserver
from plaita.store.executions.execution_io import StoreIO
from plaita.store.executions.store import ExecutionStore
from plaita.tasks import Task

logger = logging.getLogger(__name__)


class FlowRunner:
    """A handler (``runner(task)``) running the flows of ``flows`` on ``store``.

    Called from a handler thread it runs ``async def`` steps on a per-thread event loop;
    ``await runner.run_async(task)`` runs on the caller's loop, with sync steps and Redis calls
    moved off it so the loop is never blocked. ``store`` may be an ``ExecutionIO`` instead of an
    ``ExecutionStore`` (``plaita.flows.memory_io.MemoryIO``: the engine's decisions recorded,
    no server), used in both modes.
    """

    crash_verdicts = True  #: a task's ``crash_verdict`` ends its execution (``StepLoop.crashed``)

    def __init__(
        self,
        flows: FlowRegistry | Iterable[Flow],
        store: ExecutionStore | ExecutionIO,
        *,
        retention_s: int = model.DEFAULT_RETENTION_S,
        max_state_bytes: int = model.DEFAULT_MAX_STATE_BYTES,
        cancel_poll_s: float = 0.5,
        rng: random.Random | None = None,
        clock: Callable[[], float] = wall_s,
        observer: ExecutionObserver | None = None,
        slot_ttl_s: float = DEFAULT_LEASE_TTL_S,
        tracer_provider: Any = None,
        version_wait_s: float = DEFAULT_VERSION_WAIT_S,
        steps: StepCaller | None = None,
    ) -> None:
        self.flows = flows if isinstance(flows, FlowRegistry) else FlowRegistry(flows)
        self._store = store if isinstance(store, ExecutionStore) else None
        #: The door in each mode: ``runner(task)`` on a handler thread, ``run_async`` on the loop.
        self._io_here: ExecutionIO = StoreIO(store, here=True) if isinstance(store, ExecutionStore) else store
        self._io_loop: ExecutionIO = StoreIO(store, here=False) if isinstance(store, ExecutionStore) else store
        self.max_state_bytes = max_state_bytes
        self._observers: list[ExecutionObserver] = [] if observer is None else [observer]
        self._rng = rng or random.Random()
        self._clock = clock
        #: Where step functions run (threads, or ``--pool process`` children) and their time limits.
        self.steps = steps or StepCaller()
        self._watch = CancelWatch(self._io_here.cancel_flags, poll_s=cancel_poll_s)
        #: Spans of tasks and steps: ``tracer_provider`` (OpenTelemetry), else the global one, if any.
        self._tracing = Tracing(tracer_provider)
        self._children = Children()
        self._admission = Admission(
            self.flows,
            self._io_here.queue,
            max_state_bytes=max_state_bytes,
            clock=clock,
            retention_s=retention_s,
            version_wait_s=version_wait_s,
            on_child=self._children.noted,
        )
        keep_s = index_keep_s(self.flows, retention_s)  # the longest retention of the flows run here
        self._checkpoints = Checkpointer(retention_s=retention_s, index_keep_s=keep_s, max_state_bytes=max_state_bytes)
        #: Mixed fleets: who else runs which flows (set ``handover.group`` to the worker's group).
        self.handover = self._admission.handover
        #: Flow limits (``max_concurrent``, start rates); slots live as long as leases.
        self._limits = FlowLimits(self._io_here.limit_store(), self.flows, ttl_s=slot_ttl_s, rng=self._rng, clock=clock)
        self._steps = StepLoop(
            steps=self.steps,
            watch=self._watch,
            checkpoints=self._checkpoints,
            children=self._children,
            rng=self._rng,
            clock=clock,
            tell=self._tell,
        )
        #: Tasks in ``run_async`` now (on the caller's loop).
        self._running = 0

    @property
    def store(self) -> ExecutionStore:
        """The store this runner was built on (none for a runner on an ``ExecutionIO``)."""
        if self._store is None:
            raise ConfigError("this flow runner runs on an ExecutionIO, not on a store")
        return self._store

    # -- entry points --------------------------------------------------------------------
    def __call__(self, task: Task) -> None:
        # In thread mode nothing in the runner suspends (Redis calls block, async steps run to
        # completion on this thread's loop in _call), so the coroutine is driven by hand: no
        # event loop is running while a sync step runs, and it may call asyncio.run itself.
        coro = self._handle(task, self._io_here, on_loop=False)
        try:
            coro.send(None)
        except StopIteration:
            return
        coro.close()
        raise RuntimeError("flow runner suspended outside an event loop (a plaita bug)")

    async def run_async(self, task: Task) -> None:
        self._running += 1
        try:
            await self._handle(task, self._io_loop, on_loop=True)
        finally:
            self._running -= 1

    def tasks_queued(self, tasks: list[Task]) -> None:
        """The worker queued ``tasks`` (leased, none started yet) for ``run_async`` on this loop:
        send the creates of their starts now, in one write (``Admission.create_ahead``). Only
        while at most one task runs: with more, a create shares its write with their checkpoints
        anyway, and a burst of creates ahead would only delay those checkpoints (without this
        rule concurrency 4 measured 0.88-0.94x the executions/s). Not for a flow with limits: a
        start waits for its slot before its execution exists."""
        if self._running > 1:
            return
        for task in tasks:
            if task.body.get("type") != "start":
                continue
            flow = self.flows.get(task.body.get("flow_id"))
            if flow is not None and not flow.limited(start=True):
                self._admission.create_ahead(self._io_loop, task, flow)

    def add_observer(self, observer: ExecutionObserver) -> None:
        """Tell ``observer`` too about executions and steps (metrics); before the first task runs.
        Each call is guarded: an observer that raises is logged, the step goes on."""
        self._observers.append(observer)

    def fleet_entry(self) -> dict[str, Any]:
        """What this runner runs, for the worker's registry entry."""
        return self.handover.entry(self.flows)

    def close(self) -> None:
        """Stop the cancel watcher and close the per-thread loops (call once no task runs)."""
        self._watch.stop()
        self._limits.close()
        self._io_loop.close()
        self._io_here.close()
        self._steps.close()

    # -- one task --------------------------------------------------------------------------
    async def _handle(self, task: Task, io: ExecutionIO, *, on_loop: bool) -> None:
        tracer = self._tracing.active()
        if tracer is None:  # tracing off: one check, nothing else (bench/tracing.py)
            await self._limited(task, io, on_loop, None)
            return
        trace = TaskTrace(tracer, task, io.queue)
        try:
            run = await self._limited(task, io, on_loop, trace)
        except BaseException as exc:
            trace.close(exc)
            raise
        trace.outcome = run.execution.status if run is not None else "noop"
        trace.close()

    async def _limited(self, task: Task, io: ExecutionIO, on_loop: bool, trace: TaskTrace | None) -> Run | None:
        try:
            return await self._admitted(task, io, on_loop, trace)
        finally:  # the flow slot it took (if any), whatever happened: suspended, ended, failed
            if self._limits.holds(task):  # no thread hop for the tasks of unlimited flows
                await self._limits.leave(io, task)

    async def _admitted(self, task: Task, io: ExecutionIO, on_loop: bool, trace: TaskTrace | None) -> Run | None:
        start_flow = self.flows.get(task.body.get("flow_id")) if task.body.get("type") == "start" else None
        if start_flow is not None and not await self._enter(start_flow, task, io, start=True):
            return None  # a start waits for its flow's limits before it creates anything: parked
        run = await self._admission.admit(task, io)
        if run is None:  # a child that ended may not have told its parent yet (a crash)
            await self._children.redelivered(io, task)
            return None
        run.on_loop = on_loop
        run.trace = trace
        if trace is not None or TRACEPARENT in task.body:  # else joined changes nothing: not called
            run.execution = joined(trace, run.execution, run.flow.flow_id, task.body)
        flow_id = run.flow.flow_id
        if run.created:
            self._tell("execution_event", flow_id, "started")
        if task.crash_verdict is not None:  # it killed its worker process too often (runtime.suspects)
            await self._steps.crashed(run, task.crash_verdict)
        if run.ending is not None:
            await self._steps.commit(run, run.ending)
            return run
        if start_flow is None:  # a resume with work to do
            await self._enter(run.flow, task, io, start=False, params=run.execution.params)
        self._tell("run_began", flow_id)
        try:
            await self._steps.advance(run)
        finally:
            self._tell("run_ended", flow_id)
        return run

    async def _enter(self, flow: Flow, task: Task, io: ExecutionIO, *, start: bool, params: Any = None) -> bool:
        """Pass ``flow``'s fleet-wide limits (``plaita.flows.runner.limits``): True to run. False: a start
        parked until a slot is free (its task ends here, counted ``parked``). Over a start rate, or
        a resume over the limit, the task goes back to the queue (NotForThisWorker, counted
        ``throttled``)."""
        if not flow.limited(start=start):
            return True
        try:
            entered = await self._limits.passed(io, flow, task, start=start, params=params)
        except NotForThisWorker:
            self._tell("execution_event", flow.flow_id, "throttled")
            raise
        if not entered:
            self._tell("execution_event", flow.flow_id, "parked")
        return entered

    def _tell(self, name: str, *args: Any) -> None:
        for observer in self._observers:
            method = getattr(observer, name, None)  # an observer may leave a notification out
            if method is None:
                continue
            try:
                method(*args)
            except Exception:  # metrics must never fail a step
                logger.exception("execution observer %s.%s failed", type(observer).__name__, name)
