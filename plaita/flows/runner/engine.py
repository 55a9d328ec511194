"""``FlowRunner``: the worker handler that advances executions one checkpointed step at a time.

The worker gives every task the execution's lease (generation ``task.fencing_token``) before
the handler runs, so one execution never advances on two workers at once. After each step
the runner writes one fenced checkpoint (state, step index, status index, staged writes);
a worker killed during step k leaves the checkpoint of step k-1, and whoever runs the
execution next starts at step k.

One task, in this file's order: ``plaita.flows.runner.admit`` turns it into a ``Run`` (or a no-op:
every task is safe to deliver twice); a flow with fleet-wide limits first takes one of its slots
(``plaita.flows.runner.limits``: a start before admission, a resume after, given back when the task
ends; over the limit the task goes back to the queue); ``_advance`` runs steps while the
execution is running. One step (``_run_step``): build its ``StepContext``, call it, pick the
``Execution`` transition its outcome means (``_succeeded``; a suspension, a sleep, a failed
attempt: ``_suspended``, ``_sleep``, ``_failed``), and ``_commit`` it: seal it (the ``error``
execution replaces one that cannot be written), write it (``checkpoint``), make it the run's,
then tell the observers and, when it ended the execution, the flow's hooks.

Every call to execution state goes through one door, ``ExecutionIO`` (``plaita.flows.io``):
the runner holds two, one per mode (a handler thread's, the event loop's), chosen once here;
how a call travels is the adapter's business (``plaita.store.executions.execution_io``).
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

from plaita.clock import wall_s
from plaita.config import DEFAULT_LEASE_TTL_S, DEFAULT_VERSION_WAIT_S
from plaita.errors import BadTaskError, ConfigError, LeaseLostError, NotForThisWorker, StepCancelled
from plaita.flows.io import ExecutionIO
from plaita.flows.model import bodies as model
from plaita.flows.model import inbox
from plaita.flows.model.context import Receiving, Resume, Sleep, Spawn, StepContext, Suspend
from plaita.flows.model.definition import Flow, FlowRegistry, Step
from plaita.flows.model.execution import Execution
from plaita.flows.model.failures import describe_exception, error_doc, error_from_exception
from plaita.flows.model.validate import StepOutputError
from plaita.flows.retention import index_keep_s
from plaita.flows.runner.admit import Admission, Run
from plaita.flows.runner.checkpoint import CancelledMeanwhile, Checkpointer, sealed
from plaita.flows.runner.children import Children, needs_ending
from plaita.flows.runner.events import publisher
from plaita.flows.runner.invoke import Attempt
from plaita.flows.runner.limits import FlowLimits
from plaita.flows.runner.stepcall import StepCaller
from plaita.flows.runner.watch import CancelWatch
from plaita.flows.tracing import TaskTrace, Tracing, joined
from plaita.runtime.observer import ExecutionObserver
from plaita.store.executions.execution_io import StoreIO
from plaita.store.executions.store import ExecutionStore, Staged
from plaita.tasks import CancelFlag, Task

logger = logging.getLogger(__name__)

#: The ``error.type`` of an execution whose task killed its worker process ``--max-crashes`` times.
WORKER_CRASHED = "WorkerCrashed"

#: How often a pause before a retry looks at the clocks (and a sync one at the lease).
PAUSE_TICK_S = 0.1

#: Checkpoint status -> the execution event observers are told (``running`` is no event).
_STATUS_EVENTS = {"suspended": "suspended", "completed": "completed", "error": "failed", "cancelled": "cancelled"}


class FlowRunner:
    """A handler (``runner(task)``) running the flows of ``flows`` on ``store``.

    Called from a handler thread it runs ``async def`` steps on a per-thread event loop;
    ``await runner.run_async(task)`` runs on the caller's loop, with sync steps and Redis calls
    moved off it so the loop is never blocked. ``store`` may be an ``ExecutionIO`` instead of an
    ``ExecutionStore`` (``plaita.flows.memory_io.MemoryIO``: the engine's decisions recorded,
    no server), used in both modes.
    """

    crash_verdicts = True  #: a task's ``crash_verdict`` ends its execution (``_crashed``)

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
            self._io_here.fleet(),
            self._io_here.queue,
            max_state_bytes=max_state_bytes,
            clock=clock,
            retention_s=retention_s,
            version_wait_s=version_wait_s,
            on_child=self._children.noted,
        )
        keep_s = index_keep_s(self.flows, retention_s)  # the longest retention of the flows run here
        self._checkpoints = Checkpointer(retention_s=retention_s, index_keep_s=keep_s)
        #: Mixed fleets: who else runs which flows (set ``handover.group`` to the worker's group).
        self.handover = self._admission.handover
        #: Flow limits (``max_concurrent``, start rates); slots live as long as leases.
        self._limits = FlowLimits(self._io_here.limit_store(), self.flows, ttl_s=slot_ttl_s, rng=self._rng, clock=clock)
        self._local = threading.local()
        self._loops: list[asyncio.AbstractEventLoop] = []
        self._loops_lock = threading.Lock()
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
            if flow is not None and not self._limits.limited(flow, start=True):
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
        with self._loops_lock:
            loops, self._loops = self._loops, []
        for loop in loops:
            if not loop.is_running():
                loop.close()

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
                await io.blocking(self._limits.leave, task)

    async def _admitted(self, task: Task, io: ExecutionIO, on_loop: bool, trace: TaskTrace | None) -> Run | None:
        start_flow = self.flows.get(task.body.get("flow_id")) if task.body.get("type") == "start" else None
        if start_flow is not None and not await self._enter(start_flow, task, io, start=True):
            return None  # a start waits for its flow's limits before it creates anything: parked
        run = await self._admission.admit(task, io)
        if run is None:  # a child that ended may not have told its parent yet (a crash)
            await self._children.redelivered(io, task)
            return None
        run.on_loop = on_loop
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
            await self._enter(run.flow, task, io, start=False, params=run.execution.params)
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
            retry_at_s = await self._attempt(run, step)
        else:
            with run.trace.step(run.flow.flow_id, step.name, run.execution.attempt + 1):
                retry_at_s = await self._attempt(run, step)
        if retry_at_s is not None:  # a failed attempt to retry: wait outside the step's span
            await self._pause(run, retry_at_s)

    async def _attempt(self, run: Run, step: Step) -> float | None:
        """One run of ``step`` and its checkpoint; when its retry is due (on the runner's clock), if it is retried."""
        ctx = self._context(run, step)
        started_s, began_s = self._clock(), time.monotonic()
        self._watch.add(ctx, run.task, limit_s=self.steps.soft_limit_of(step))
        try:
            attempt = await self.steps.call(step, ctx, on_loop=run.on_loop, thread_loop=self._thread_loop)
        finally:
            self._watch.remove(ctx)
        if isinstance(attempt.raised, StepCancelled):  # its child was killed for a cancel: no failure
            self._step_finished(run, step, "failed", began_s, attempt.raised)
            run.cancel = True  # _advance ends it cancelled (or stops, if it was the lease that went)
            return None
        if isinstance(attempt.raised, Receiving):  # ctx.recv with no message at hand: a wait for its topic
            attempt = Attempt(value=attempt.raised.suspension)
        if attempt.raised is not None:  # any BaseException: a failed attempt (plaita/flows/runner/invoke.py)
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
            resume=_resume_of(resume),
            attempt=ex.attempt + 1,
            cancel=CancelFlag(),
            deadline_at=ex.deadline_at,
            publisher=publisher(run.io.events(run.task), run.task, step.name, self._clock),
            slot_tag=run.io.slot_tag(run.task.execution_id),
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

    async def _enter(self, flow: Flow, task: Task, io: ExecutionIO, *, start: bool, params: Any = None) -> bool:
        """Pass ``flow``'s fleet-wide limits (``plaita.flows.runner.limits``): True to run. False: a start
        parked until a slot is free (its task ends here, counted ``parked``). Over a start rate, or
        a resume over the limit, the task goes back to the queue (NotForThisWorker, counted
        ``throttled``)."""
        if not self._limits.limited(flow, start=start):
            return True
        try:
            entered = await self._limits.passed(io, flow, task, start=start, params=params)
        except NotForThisWorker:
            self._tell("execution_event", flow.flow_id, "throttled")
            raise
        if not entered:
            self._tell("execution_event", flow.flow_id, "parked")
        return entered

    # -- what a step that does not simply return leads to ----------------------------------
    async def _suspended(self, run: Run, step: Step, ctx: StepContext, value: Suspend, started_s: float) -> None:
        now_s = self._clock()
        if isinstance(value, Sleep):
            await self._sleep(run, step, ctx, value, started_s, now_s)
            return
        deadline_s = None if value.timeout_s is None else now_s + value.timeout_s
        ex = run.execution.suspended(step.name, ctx.state, ctx.attempt, started_s, now_s, deadline_s, value.wait_for)
        if isinstance(value, Spawn):  # start its children (plaita.flows.runner.children), then wait on them
            ex = await self._children.spawn(run.io, run, step.name, value, ex)
            if ex.status == "running":  # every child had ended already (a re-run step): joined
                await self._commit(run, ex, step=step, staged=ctx.staged, output=True)
                return
        pending = run.pending
        if pending is not None:  # a resume arrived before this suspension: apply it now
            await self._commit(run, ex.resumed(*pending, now_s), step=step, staged=ctx.staged, output=True)
            run.pending = None
            return
        taken = inbox.take(ex, value.wait_for, now_s)
        if taken is not None:  # the resume this wait is for came earlier and was kept: go on at once
            await self._commit(run, taken, step=step, staged=ctx.staged, output=True)
            return
        await self._commit(run, ex, step=step, staged=ctx.staged, output=True, deadline_s=deadline_s)
        if await self._cancelled_meanwhile(run):
            return
        if isinstance(value, Spawn) and run.execution.status == "suspended":
            joined = await self._children.settled(run.io, run)  # all ended meanwhile?
            if joined is not None:
                await self._commit(run, joined)

    async def _cancelled_meanwhile(self, run: Run) -> bool:
        """Right after a suspension (or sleep) checkpoint: when a cancel came while its step ran
        (the checkpoint reported the flag) or the deadline passed, end it ``cancelled`` now (its
        children too): no cancel task was sent for a running execution, so none would come."""
        if run.execution.status != "suspended":
            return False
        if not (run.cancel or run.execution.past_deadline(self._clock())):
            return False
        await self._commit(run, run.execution.cancelled(self._clock()))
        return True

    async def _sleep(
        self, run: Run, step: Step, ctx: StepContext, value: Sleep, started_s: float, now_s: float
    ) -> None:
        """A durable sleep: a suspension whose deadline (the keeper's ``continue``) runs the next step."""
        until_s = max(now_s, value.until_s) if value.until_s is not None else now_s + (value.timeout_s or 0.0)
        index = run.execution.step_index + 1 if ctx.next_step is None else run.flow.index_of(ctx.next_step)
        if index is None:
            await self._succeeded(run, step, ctx, None, started_s)  # the unknown step's error, as for a return
            return
        following = run.flow.steps[index].name if index < len(run.flow.steps) else None
        if run.pending is not None:  # a resume that arrived while running does not cut a sleep short
            logger.info("execution %s: resume %s ignored, the step slept", run.task.execution_id, run.pending[2])
            run.pending = None
        ex = run.execution.sleeping(step.name, ctx.state, following, ctx.attempt, started_s, now_s, until_s)
        await self._commit(run, ex, step=step, staged=ctx.staged, output=True, deadline_s=until_s)
        await self._cancelled_meanwhile(run)

    async def _failed(self, run: Run, step: Step, attempt: int, exc: BaseException, started_s: float) -> float | None:
        """Checkpoint a failed attempt: the execution fails (None), or when its retry is due, on the
        runner's clock: counted from the failure, so a clock moved ahead after the checkpoint (a
        test's) is never counted twice."""
        if run.task.cancelled.is_set():
            raise LeaseLostError(f"lease of execution {run.task.execution_id} lost during step {step.name!r}")
        now_s, policy, problem = self._clock(), step.retry, describe_exception(exc)
        where = f"execution {run.task.execution_id}: step {step.name!r}"
        retryable = isinstance(exc, StepOutputError) or policy.retryable(exc)
        if not retryable or attempt >= policy.max_attempts:
            logger.warning("%s failed for good (attempt %d): %s", where, attempt, problem)
            error = error_from_exception(step.name, exc, attempt)
            await self._commit(
                run, run.execution.failed(step.name, attempt, started_s, now_s, problem, error), step=step
            )
            return None
        delay_s = policy.delay_s(attempt, self._rng)
        logger.info(
            "%s failed (attempt %d of %d), retry in %.2f s: %s", where, attempt, policy.max_attempts, delay_s, problem
        )
        await self._commit(run, run.execution.retrying(step.name, attempt, started_s, now_s, problem), step=step)
        retry_at_s = now_s + delay_s
        if run.execution.deadline_at is not None:  # no waiting past the deadline: cancelled then
            retry_at_s = min(retry_at_s, run.execution.deadline_at)
        return retry_at_s

    async def _crashed(self, run: Run, reason: str) -> None:
        """The task killed its worker process ``--max-crashes`` times (``Task.crash_verdict``, set
        by ``plaita.runtime.suspects``): end its execution ``error`` with the reason, without running
        the step again, then send the task to the DLQ with it (BadTaskError)."""
        ex, now_s = run.execution, self._clock()
        step = ex.step or "?"
        logger.error("execution %s: step %r %s: execution ends in error", run.task.execution_id, step, reason)
        error = error_doc(ex.step, WORKER_CRASHED, reason)
        await self._commit(run, ex.failed(step, ex.attempt + 1, now_s, now_s, reason, error))
        raise BadTaskError(reason)

    async def _pause(self, run: Run, retry_at_s: float) -> None:
        """Wait until ``retry_at_s`` between attempts; LeaseLostError as soon as the lease is lost.
        It ends when either the runner's clock says so or the machine's monotonic clock has
        counted what was left at the start: a wall clock set back never lengthens it, and a test
        clock moved ahead (``plaita.testing``) ends it."""
        cancelled = run.task.cancelled
        until_mono_s = time.monotonic() + max(0.0, retry_at_s - self._clock())
        while not cancelled.is_set():
            left_s = min(retry_at_s - self._clock(), until_mono_s - time.monotonic())
            if left_s <= 0:
                break
            if run.on_loop:
                await asyncio.sleep(min(PAUSE_TICK_S, left_s))
            else:
                cancelled.wait(min(PAUSE_TICK_S, left_s))
        if cancelled.is_set():
            raise LeaseLostError(f"lease of execution {run.task.execution_id} lost while waiting to retry")

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
            cancel = await self._checkpoints.write(
                run.io,
                run.task,
                text,
                status=written.status,
                now_s=written.updated_at,
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
            await self._children.ended(run.io, run.task, run.execution)
        for hook in run.flow.hooks_for(run.execution.status):
            # Called like a step (any BaseException comes back as a value): a hook's bug must not
            # fail a task whose execution is already over.
            attempt = await self.steps.hook(hook, run.execution, on_loop=run.on_loop, thread_loop=self._thread_loop)
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


def _resume_of(resume: dict[str, Any] | None) -> Resume | None:
    if resume is None:
        return None
    wait_for = resume.get("wait_for")
    return Resume(resume.get("type", "continue"), resume.get("data"), wait_for if isinstance(wait_for, str) else None)
