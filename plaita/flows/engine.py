"""``FlowRunner``: the worker handler that advances executions one checkpointed step at a time.

The worker gives every task the execution's lease (generation ``task.fencing_token``) before
the handler runs, so one execution never advances on two workers at once. After each step
the runner writes one fenced checkpoint (state, step index, status index, staged writes);
a worker killed during step k leaves the checkpoint of step k-1, and whoever runs the
execution next starts at step k.

One task, in this file's order: ``plaita.flows.admit`` turns it into a ``Run`` (or a no-op:
every task is safe to deliver twice); a flow with fleet-wide limits first takes one of its slots
(``plaita.flows.throttle``, ``plaita.flows.limits``: a start before admission, a resume after,
given back when the task ends; over the limit the task goes back to the queue); ``_advance``
runs steps while the execution is running.
One step (``_run_step``): build its ``StepContext``, call it, pick the ``Execution`` transition
its outcome means (``_succeeded`` here; ``_suspended``, ``_sleep``, ``_failed`` in
``plaita.flows.waits``), and ``_commit`` it: seal it (the ``error`` execution replaces one that
cannot be written), write it (``checkpoint``; on the caller's loop batched with the other
executions' calls, ``plaita.flows.batch``), make it the run's, then tell the observers and,
when it ended the execution, the flow's hooks.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import random
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from plaita.config import DEFAULT_LEASE_TTL_S, DEFAULT_VERSION_WAIT_S
from plaita.errors import LeaseLostError, StepCancelled
from plaita.flows import inbox, model
from plaita.flows.admit import Run
from plaita.flows.batch import CallBatcher
from plaita.flows.checkpoint import CancelledMeanwhile, call_io, sealed
from plaita.flows.children import Children, needs_ending
from plaita.flows.context import Resume, StepContext, Suspend
from plaita.flows.definition import Flow, FlowRegistry, Step
from plaita.flows.events import publisher
from plaita.flows.execution import Execution, error_doc
from plaita.flows.handover import Handover, fleet_entry
from plaita.flows.invoke import invoke
from plaita.flows.limits import FlowLimits
from plaita.flows.scopes import Scope, ScopeParts, TenantScopes
from plaita.flows.stepcall import StepCaller
from plaita.flows.throttle import Throttle
from plaita.flows.tracing import TaskTrace, Tracing, joined
from plaita.flows.validate import StepOutputError
from plaita.flows.waits import StepWaits
from plaita.flows.watch import CancelWatch
from plaita.runtime.observer import ExecutionObserver
from plaita.store.calls import batchable
from plaita.store.executions import ExecutionStore, Staged
from plaita.store.flow_limits import FlowLimitStore
from plaita.tasks import CancelFlag, Task

logger = logging.getLogger(__name__)  # plaita.flows.waits logs under this name too

#: Checkpoint status -> the execution event observers are told (``running`` is no event).
_STATUS_EVENTS = {"suspended": "suspended", "completed": "completed", "error": "failed", "cancelled": "cancelled"}


class FlowRunner(StepWaits, Throttle):
    """A handler (``runner(task)``) running the flows of ``flows`` on ``store``.

    Called from a handler thread it runs ``async def`` steps on a per-thread event loop;
    ``await runner.run_async(task)`` runs on the caller's loop, with sync steps and Redis calls
    moved to threads so the loop is never blocked.
    """

    crash_verdicts = True  #: a task's ``crash_verdict`` ends its execution (``StepWaits._crashed``)

    def __init__(
        self,
        flows: FlowRegistry | Iterable[Flow],
        store: ExecutionStore,
        *,
        retention_s: int = model.DEFAULT_RETENTION_S,
        max_state_bytes: int = model.DEFAULT_MAX_STATE_BYTES,
        cancel_poll_s: float = 0.5,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.time,
        observer: ExecutionObserver | None = None,
        slot_ttl_s: float = DEFAULT_LEASE_TTL_S,
        tracer_provider: Any = None,
        version_wait_s: float = DEFAULT_VERSION_WAIT_S,
        steps: StepCaller | None = None,
    ) -> None:
        self.flows = flows if isinstance(flows, FlowRegistry) else FlowRegistry(flows)
        self.store = store
        self.max_state_bytes = max_state_bytes
        self._observers: list[ExecutionObserver] = [] if observer is None else [observer]
        self._rng = rng or random.Random()
        self._clock = clock
        #: Where step functions run (threads, or ``--pool process`` children) and their time limits.
        self.steps = steps or StepCaller()
        self._watch = CancelWatch(store, poll_s=cancel_poll_s)
        #: On the caller's loop (``run_async``) creates and checkpoints go out in batches.
        self._batcher = CallBatcher() if batchable(store.client) else None
        #: Spans of tasks and steps: ``tracer_provider`` (OpenTelemetry), else the global one, if any.
        self._tracing = Tracing(tracer_provider)
        #: Mixed fleets: who else runs which flows (set ``handover.group`` to the worker's group).
        self.handover = Handover(store.client, store.ks.queue)
        #: The default tenant's parts; another tenant's (``_scope``) are made on its first task.
        parts = ScopeParts(
            self.flows, self.handover, max_state_bytes, retention_s, clock, self._batcher, version_wait_s
        )
        self._scopes = TenantScopes(store, parts)
        default = self._scopes.default
        self._admission, self._checkpoints, self._children = default.admission, default.checkpoints, default.children
        #: Flow limits (``max_concurrent``, start rates); slots live as long as leases.
        self._limits = FlowLimits(FlowLimitStore(store.client, store.ks), self.flows, ttl_s=slot_ttl_s, rng=self._rng)
        self._local = threading.local()
        self._loops: list[asyncio.AbstractEventLoop] = []
        self._loops_lock = threading.Lock()
        #: Tasks in ``run_async`` now (on the caller's loop).
        self._running = 0

    def _scope(self, task: Task) -> Scope:
        """The parts working on ``task``'s tenant's store (its body's ``tenant_id``)."""
        return self._scopes.of(task)

    def _children_for(self, task: Task) -> Children:
        return self._scope(task).children

    # -- entry points --------------------------------------------------------------------
    def __call__(self, task: Task) -> None:
        # In thread mode nothing in the runner suspends (Redis calls block, async steps run to
        # completion on this thread's loop in _call), so the coroutine is driven by hand: no
        # event loop is running while a sync step runs, and it may call asyncio.run itself.
        coro = self._handle(task, offload=False)
        try:
            coro.send(None)
        except StopIteration:
            return
        coro.close()
        raise RuntimeError("flow runner suspended outside an event loop (a plaita bug)")

    def _thread_loop(self) -> asyncio.AbstractEventLoop:
        loop: asyncio.AbstractEventLoop | None = getattr(self._local, "loop", None)
        if loop is None:
            loop = self._local.loop = asyncio.new_event_loop()
            with self._loops_lock:
                self._loops.append(loop)
        return loop

    async def run_async(self, task: Task) -> None:
        self._running += 1
        try:
            await self._handle(task, offload=True)
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
            if flow is not None and not self._limits.limited(flow, start=True):
                self._scope(task).admission.create_ahead(task, flow)

    def add_observer(self, observer: ExecutionObserver) -> None:
        """Tell ``observer`` too about executions and steps (metrics); before the first task runs.
        Each call is guarded: an observer that raises is logged, the step goes on."""
        self._observers.append(observer)

    def fleet_entry(self) -> dict[str, Any]:
        """What this runner runs, for the worker's registry entry."""
        return fleet_entry(self.flows)

    def close(self) -> None:
        """Stop the cancel watcher and close the per-thread loops (call once no task runs)."""
        self._watch.stop()
        self._limits.close()
        if self._batcher is not None:
            self._batcher.stop()
        with self._loops_lock:
            loops, self._loops = self._loops, []
        for loop in loops:
            if not loop.is_running():
                loop.close()

    # -- one task --------------------------------------------------------------------------
    async def _handle(self, task: Task, *, offload: bool) -> None:
        tracer = self._tracing.active()
        if tracer is None:  # tracing off: one check, nothing else (bench/tracing.py)
            await self._limited(task, offload, None)
            return
        trace = TaskTrace(tracer, task, self.store.ks.queue)
        try:
            run = await self._limited(task, offload, trace)
        except BaseException as exc:
            trace.close(exc)
            raise
        trace.outcome = run.execution.status if run is not None else "noop"
        trace.close()

    async def _limited(self, task: Task, offload: bool, trace: TaskTrace | None) -> Run | None:
        try:
            return await self._admitted(task, offload, trace)
        finally:  # the flow slot it took (if any), whatever happened: suspended, ended, failed
            if self._limits.holds(task):  # no thread hop for the tasks of unlimited flows
                await call_io(offload, self._limits.leave, task)

    async def _admitted(self, task: Task, offload: bool, trace: TaskTrace | None) -> Run | None:
        start_flow = self.flows.get(task.body.get("flow_id")) if task.body.get("type") == "start" else None
        if start_flow is not None and not await self._enter(start_flow, task, offload, start=True):
            return None  # a start waits for its flow's limits before it creates anything: parked
        scope = self._scope(task)
        run = await scope.admission.admit(task, offload)
        if run is None:  # a child that ended may not have told its parent yet (a crash)
            await call_io(offload, scope.children.redelivered, task.execution_id)
            return None
        run.trace, run.execution = trace, joined(trace, run.execution, run.flow.flow_id, task.body)
        flow_id = run.flow.flow_id
        if run.created:
            self._tell("execution_event", flow_id, "started")
        if task.crash_verdict is not None:  # it killed its worker process too often (runtime.suspects)
            await self._crashed(run, task.crash_verdict)
        if run.ending is not None:
            await self._commit(run, run.ending)
            return run
        if start_flow is None:  # a resume with work to do
            await self._enter(run.flow, task, offload, start=False)
        self._tell("run_began", flow_id)
        try:
            await self._advance(run)
        finally:
            self._tell("run_ended", flow_id)
        return run

    async def _advance(self, run: Run) -> None:
        # Every step ends in a checkpoint; the status it wrote (not the step's wish: a state
        # that cannot be written turns into ``error``) decides whether another step runs.
        while run.execution.status == "running":
            if run.task.cancelled.is_set():
                raise LeaseLostError(f"lease of execution {run.task.execution_id} lost")
            now_s = self._clock()
            if run.cancel or run.execution.past_deadline(now_s):  # a cancel, or its deadline passed
                await self._commit(run, run.execution.cancelled(now_s))
                return
            await self._run_step(run, run.flow.steps[run.execution.step_index])
        if run.pending is not None:
            logger.info(
                "execution %s ended without suspending: resume %s was not needed", run.task.execution_id, run.pending[2]
            )

    # -- one step: context, run, transition, checkpoint ------------------------------------
    async def _run_step(self, run: Run, step: Step) -> None:
        if run.trace is None:
            delay_s = await self._attempt(run, step)
        else:
            with run.trace.step(run.flow.flow_id, step.name, run.execution.attempt + 1):
                delay_s = await self._attempt(run, step)
        if delay_s is not None:  # a failed attempt to retry: wait outside the step's span
            await self._pause(run, delay_s)

    async def _attempt(self, run: Run, step: Step) -> float | None:
        """One run of ``step`` and its checkpoint; the delay before its retry, if it is retried."""
        ctx = self._context(run, step)
        started_s, began_s = self._clock(), time.monotonic()
        self._watch.add(ctx, run.task)
        try:
            attempt = await self.steps.call(step, ctx, offload=run.offload, thread_loop=self._thread_loop)
        finally:
            self._watch.remove(ctx)
        if isinstance(attempt.raised, StepCancelled):  # its child was killed for a cancel: no failure
            self._step_finished(run, step, "failed", began_s, attempt.raised)
            run.cancel = True  # _advance ends it cancelled (or stops, if it was the lease that went)
            return None
        if attempt.raised is not None:  # any BaseException: a failed attempt (plaita/flows/invoke.py)
            self._step_finished(run, step, "failed", began_s, attempt.raised)
            return await self._failed(run, step, ctx.attempt, attempt.raised, started_s)
        value = attempt.value
        self._step_finished(run, step, "suspended" if isinstance(value, Suspend) else "ok", began_s)
        try:
            await self._succeeded(run, step, ctx, value, started_s)
        except StepOutputError as exc:  # nothing was written: a failed attempt of the step
            if run.trace is not None:
                run.trace.step_finished("failed", exc)
            return await self._failed(run, step, ctx.attempt, exc, started_s)
        return None

    def _context(self, run: Run, step: Step) -> StepContext:
        ex = run.execution
        resume = ex.resume
        return StepContext(
            execution_id=run.task.execution_id,
            flow_id=run.flow.flow_id,
            step=step.name,
            params=ex.params,
            state=copy.deepcopy(ex.state),
            results=ex.results,
            resume=Resume(resume.get("type", "continue"), resume.get("data")) if resume is not None else None,
            attempt=ex.attempt + 1,
            cancel=CancelFlag(),
            deadline_at=ex.deadline_at,
            publisher=publisher(self.store.of(run.task), run.task, step.name, self._clock),
            slot_tag=self.store.ks.slot_tag(run.task.execution_id),
        )

    async def _succeeded(self, run: Run, step: Step, ctx: StepContext, value: Any, started_s: float) -> None:
        ex, now_s, steps = run.execution, self._clock(), run.flow.steps
        if isinstance(value, Suspend):
            await self._suspended(run, step, ctx, value, started_s)
            return
        index = ex.step_index + 1 if ctx.next_step is None else run.flow.index_of(ctx.next_step)
        if index is None:
            message = f"step {step.name!r} chose an unknown next step {ctx.next_step!r}"
            logger.error("execution %s: %s", run.task.execution_id, message)
            error = error_doc(step.name, "UnknownStep", message)
            await self._commit(run, ex.failed(step.name, ctx.attempt, now_s, now_s, message, error), step=step)
            return
        following = (index, steps[index].name) if index < len(steps) else None
        done = ex.step_done(step.name, value, ctx.state, following, ctx.attempt, started_s, now_s)
        await self._commit(run, done, step=step, staged=ctx.staged, output=True)

    # -- the checkpoint and what follows it ------------------------------------------------
    async def _commit(
        self,
        run: Run,
        execution: Execution,
        *,
        step: Step | None = None,
        staged: list[Staged] | None = None,
        output: bool = False,
        deadline_s: float | None = None,
    ) -> None:
        """Checkpoint ``execution`` (or the ``error`` one replacing it when it cannot be written:
        ``sealed``) and make it the run's; then tell the observers and, if it ended, the hooks.
        A ``completed`` one past its deadline, or refused by the script because a cancel came
        during the last step, is discarded (result and staged writes): ``cancelled`` instead."""
        name = step.name if step is not None else None
        now_s = self._clock()
        if execution.status == "completed" and execution.past_deadline(now_s):
            execution, staged, deadline_s = run.execution.cancelled(now_s), None, None
        wanted = execution.stamped(now_s)
        written, text = sealed(wanted, self.max_state_bytes, name, output=output)
        if written.status != wanted.status:  # replaced: none of the step's writes, no deadline
            logger.error("execution %s: %s", run.task.execution_id, (written.error or {}).get("message"))
            staged, deadline_s = None, None
        if written.status == "suspended" and deadline_s is None:  # still waiting (a resume kept): its deadline stays
            deadline_s = (written.suspension or {}).get("deadline")
        inbox.left_over(written)
        if written.status == "suspended" and written.deadline_at is not None:
            # The keeper finds a suspension past the whole execution's deadline by the same index.
            deadline_s = written.deadline_at if deadline_s is None else min(deadline_s, written.deadline_at)
        try:
            cancel = await self._scope(run.task).checkpoints.write(
                run.task,
                text,
                status=written.status,
                now_s=written.updated_at,
                offload=run.offload,
                staged=staged or (),
                deadline_s=deadline_s,
                step=name,
                retention_s=run.flow.retention_s,
            )
        except CancelledMeanwhile:  # nothing was written; ``cancelled`` is never refused
            run.cancel = True
            await self._commit(run, run.execution.cancelled(self._clock()))
            return
        run.execution, run.cancel = written, run.cancel or cancel
        event = _STATUS_EVENTS.get(written.status)
        if event is not None:
            self._tell("execution_event", run.flow.flow_id, event)
        await self._ended(run)

    async def _ended(self, run: Run) -> None:
        """After a checkpoint that ended ``run.execution`` (else nothing): tell its parent (a child)
        and cancel its children (cancelled while waiting on them); then call the flow's hooks (each guarded)."""
        if run.execution.status == "error":  # alert webhooks: the ids and the error, never the state
            self._tell("execution_failed", run.flow.flow_id, run.task.execution_id, run.execution.error)
        if not run.execution.terminal:
            return
        if needs_ending(run.execution):  # no thread hop for an execution with no parent nor children
            await call_io(run.offload, self._scope(run.task).children.ended, run.execution)
        for hook in run.flow.hooks_for(run.execution.status):
            # Called like a step (any BaseException comes back as a value): a hook's bug must not
            # fail a task whose execution is already over.
            attempt = await invoke(hook, run.execution, offload=run.offload, thread_loop=self._thread_loop)
            if attempt.raised is not None:
                logger.error(
                    "execution %s: %s hook %s raised; ignored",
                    run.task.execution_id,
                    run.execution.status,
                    getattr(hook, "__qualname__", repr(hook)),
                    exc_info=attempt.raised,
                )

    def _tell(self, name: str, *args: Any) -> None:
        for observer in self._observers:
            method = getattr(observer, name, None)  # an observer may leave a notification out
            if method is None:
                continue
            try:
                method(*args)
            except Exception:  # metrics must never fail a step
                logger.exception("execution observer %s.%s failed", type(observer).__name__, name)

    def _step_finished(
        self, run: Run, step: Step, outcome: str, began_s: float, raised: BaseException | None = None
    ) -> None:
        if run.trace is not None:
            run.trace.step_finished(outcome, raised)
        self._tell("step_finished", run.flow.flow_id, step.name, outcome, time.monotonic() - began_s)
