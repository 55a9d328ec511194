"""The step loop: an admitted task's execution advanced one checkpointed step at a time.

``plaita.flows.runner.engine`` turns a task into a ``Run`` (admission, flow limits, tracing);
this module runs its steps while the execution is running (``advance``). One step
(``_run_step``): build its ``StepContext``, call it (``plaita.flows.runner.stepcall``), pick the
``Execution`` transition its outcome means (``_succeeded``; a suspension, a sleep, a failed
attempt: ``_suspended``, ``_sleep``, ``_failed``), and ``commit`` it: seal it (the ``error``
execution replaces one that cannot be written), write it (``plaita.flows.runner.checkpoint``),
make it the run's, then tell the observers and, when it ended the execution, the flow's hooks.

After each step the loop writes one fenced checkpoint (state, step index, status index, staged
writes); a worker killed during step k leaves the checkpoint of step k-1, and whoever runs the
execution next starts at step k.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from plaita.errors import BadTaskError, LeaseLostError, StepCancelled
from plaita.flows.model import inbox
from plaita.flows.model.context import Receiving, Resume, Sleep, Spawn, StepContext, Suspend
from plaita.flows.model.definition import Step
from plaita.flows.model.execution import Execution
from plaita.flows.model.failures import describe_exception, error_doc, error_from_exception
from plaita.flows.model.validate import StepOutputError, copied_state
from plaita.flows.runner.admit import Run
from plaita.flows.runner.checkpoint import CancelledMeanwhile, Checkpointer
from plaita.flows.runner.children import Children, needs_ending
from plaita.flows.runner.events import publisher
from plaita.flows.runner.invoke import Attempt
from plaita.flows.runner.stepcall import StepCaller
from plaita.flows.runner.watch import CancelWatch
from plaita.store.executions.store import TERMINAL, Staged
from plaita.tasks import CancelFlag

logger = logging.getLogger(__name__)

#: The ``error.type`` of an execution whose task killed its worker process ``--max-crashes`` times.
WORKER_CRASHED = "WorkerCrashed"

#: How often a pause before a retry looks at the clocks (and a sync one at the lease).
PAUSE_TICK_S = 0.1

#: Checkpoint status -> the execution event observers are told (``running`` is no event).
_STATUS_EVENTS = {"suspended": "suspended", "completed": "completed", "error": "failed", "cancelled": "cancelled"}


class StepLoop:
    """Runs the steps of admitted runs and checkpoints each outcome (``advance``, ``commit``).
    ``tell(name, *args)`` notifies the runner's observers."""

    def __init__(
        self,
        *,
        steps: StepCaller,
        watch: CancelWatch,
        checkpoints: Checkpointer,
        children: Children,
        rng: random.Random,
        clock: Callable[[], float],
        tell: Callable[..., None],
    ) -> None:
        self.steps, self._watch, self._checkpoints, self._children = steps, watch, checkpoints, children
        self._rng, self._clock, self._tell = rng, clock, tell
        self._local = threading.local()
        self._loops: list[asyncio.AbstractEventLoop] = []
        self._loops_lock = threading.Lock()

    def thread_loop(self) -> asyncio.AbstractEventLoop:
        """The calling handler thread's own loop, where its ``async def`` steps and hooks run
        (made at its first use, closed by ``close``)."""
        loop: asyncio.AbstractEventLoop | None = getattr(self._local, "loop", None)
        if loop is None:
            loop = self._local.loop = asyncio.new_event_loop()
            with self._loops_lock:
                self._loops.append(loop)
        return loop

    def close(self) -> None:
        """Close the per-thread loops (call once no step runs)."""
        with self._loops_lock:
            loops, self._loops = self._loops, []
        for loop in loops:
            if not loop.is_running():
                loop.close()

    async def advance(self, run: Run) -> None:
        # Every step ends in a checkpoint; the status it wrote (not the step's wish: a state
        # that cannot be written turns into ``error``) decides whether another step runs.
        while run.execution.status == "running":
            if run.task.cancelled.is_set():
                raise LeaseLostError(f"lease of execution {run.task.execution_id} lost")
            now_s = self._clock()
            if run.cancel or run.execution.past_deadline(now_s):  # a cancel, or its deadline passed
                await self.commit(run, run.execution.cancelled(now_s))
                return
            step = run.flow.steps[run.execution.step_index]
            if run.trace is not None:
                await self._run_step(run, step)
                continue
            retry_at_s = await self._attempt(run, step)  # tracing off: no span, no coroutine around the step
            if retry_at_s is not None:  # a failed attempt to retry
                await self._pause(run, retry_at_s)
        if run.pending is not None:
            logger.info(
                "execution %s ended without suspending: resume %s was not needed", run.task.execution_id, run.pending[2]
            )

    # -- one step: context, run, transition, checkpoint ------------------------------------
    async def _run_step(self, run: Run, step: Step) -> None:
        """One step in its span (tracing on; ``advance`` runs it without one otherwise)."""
        assert run.trace is not None
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
            attempt = await self.steps.call(step, ctx, on_loop=run.on_loop, thread_loop=self.thread_loop)
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
        writer, slot_tag = run.io.for_step(run.task)
        return StepContext(
            execution_id=run.task.execution_id,
            flow_id=run.flow.flow_id,
            step=step.name,
            params=ex.params,
            state=copied_state(ex.state) if ex.state else {},  # most steps of most flows: an empty state
            results=ex.results,
            resume=None if resume is None else _resume_of(resume),
            attempt=ex.attempt + 1,
            cancel=CancelFlag(),
            deadline_at=ex.deadline_at,
            publisher=publisher(writer, run.task, step.name, self._clock),
            slot_tag=slot_tag,
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
            await self.commit(run, ex.failed(step.name, ctx.attempt, now_s, now_s, message, error), step=step)
            return
        following = (index, steps[index].name) if index < len(steps) else None
        done = ex.step_done(step.name, value, ctx.state, following, ctx.attempt, started_s, now_s)
        await self.commit(run, done, step=step, staged=ctx.staged, output=True)

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
                await self.commit(run, ex, step=step, staged=ctx.staged, output=True)
                return
        pending = run.pending
        if pending is not None:  # a resume arrived before this suspension: apply it now
            await self.commit(run, ex.resumed(*pending, now_s), step=step, staged=ctx.staged, output=True)
            run.pending = None
            return
        taken = inbox.take(ex, value.wait_for, now_s)
        if taken is not None:  # the resume this wait is for came earlier and was kept: go on at once
            await self.commit(run, taken, step=step, staged=ctx.staged, output=True)
            return
        await self.commit(run, ex, step=step, staged=ctx.staged, output=True, deadline_s=deadline_s)
        if await self._cancelled_meanwhile(run):
            return
        if isinstance(value, Spawn) and run.execution.status == "suspended":
            joined = await self._children.settled(run.io, run)  # all ended meanwhile?
            if joined is not None:
                await self.commit(run, joined)

    async def _cancelled_meanwhile(self, run: Run) -> bool:
        """Right after a suspension (or sleep) checkpoint: when a cancel came while its step ran
        (the checkpoint reported the flag) or the deadline passed, end it ``cancelled`` now (its
        children too): no cancel task was sent for a running execution, so none would come."""
        if run.execution.status != "suspended":
            return False
        if not (run.cancel or run.execution.past_deadline(self._clock())):
            return False
        await self.commit(run, run.execution.cancelled(self._clock()))
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
        await self.commit(run, ex, step=step, staged=ctx.staged, output=True, deadline_s=until_s)
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
            await self.commit(
                run, run.execution.failed(step.name, attempt, started_s, now_s, problem, error), step=step
            )
            return None
        delay_s = policy.delay_s(attempt, self._rng)
        logger.info(
            "%s failed (attempt %d of %d), retry in %.2f s: %s", where, attempt, policy.max_attempts, delay_s, problem
        )
        await self.commit(run, run.execution.retrying(step.name, attempt, started_s, now_s, problem), step=step)
        retry_at_s = now_s + delay_s
        if run.execution.deadline_at is not None:  # no waiting past the deadline: cancelled then
            retry_at_s = min(retry_at_s, run.execution.deadline_at)
        return retry_at_s

    async def crashed(self, run: Run, reason: str) -> None:
        """The task killed its worker process ``--max-crashes`` times (``Task.crash_verdict``, set
        by ``plaita.runtime.suspects``): end its execution ``error`` with the reason, without running
        the step again, then send the task to the DLQ with it (BadTaskError)."""
        ex, now_s = run.execution, self._clock()
        step = ex.step or "?"
        logger.error("execution %s: step %r %s: execution ends in error", run.task.execution_id, step, reason)
        error = error_doc(ex.step, WORKER_CRASHED, reason)
        await self.commit(run, ex.failed(step, ex.attempt + 1, now_s, now_s, reason, error))
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
    async def commit(
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
        ``Checkpointer.put``) and make it the run's; then tell the observers and, if it ended, the hooks.
        A ``completed`` one past its deadline, or refused by the script because a cancel came
        during the last step, is discarded (result and staged writes): ``cancelled`` instead."""
        name = step.name if step is not None else None
        now_s = self._clock()
        if execution.status == "completed" and execution.past_deadline(now_s):
            execution, staged, deadline_s = run.execution.cancelled(now_s), None, None
        try:
            written, cancel = await self._checkpoints.put(
                run.io,
                run.task,
                execution,
                now_s=now_s,
                step=name,
                output=output,
                staged=staged or (),
                deadline_s=deadline_s,
                retention_s=run.flow.retention_s,
                after_running=run.indexed_running,
            )
        except CancelledMeanwhile:  # nothing was written; ``cancelled`` is never refused
            run.cancel = True
            await self.commit(run, run.execution.cancelled(self._clock()))
            return
        run.execution, run.cancel = written, run.cancel or cancel
        run.indexed_running = written.status == "running"
        event = _STATUS_EVENTS.get(written.status)
        if event is not None:
            self._tell("execution_event", run.flow.flow_id, event)
        if written.status in TERMINAL:  # else ``_ended`` has nothing to do: no coroutine per step
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
            attempt = await self.steps.hook(hook, run.execution, on_loop=run.on_loop, thread_loop=self.thread_loop)
            if attempt.raised is not None:
                logger.error(
                    "execution %s: %s hook %s raised; ignored",
                    run.task.execution_id,
                    run.execution.status,
                    getattr(hook, "__qualname__", repr(hook)),
                    exc_info=attempt.raised,
                )

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
