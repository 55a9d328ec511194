"""What a step that does not simply return leads to, for ``FlowRunner`` (``plaita.flows.engine``):
a suspension (a wait, or children spawned and joined), a durable sleep, a failed attempt and
the pause before its retry. Each picks the ``Execution`` transition and hands it to the
runner's ``_commit``; this class holds no state of its own.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from typing import Any

from plaita.errors import BadTaskError, LeaseLostError
from plaita.flows import inbox
from plaita.flows.admit import Run
from plaita.flows.checkpoint import call_io
from plaita.flows.children import Children
from plaita.flows.context import Sleep, Spawn, StepContext, Suspend
from plaita.flows.definition import Step
from plaita.flows.execution import Execution
from plaita.flows.failures import describe_exception, error_doc, error_from_exception
from plaita.flows.validate import StepOutputError
from plaita.store.executions import Staged
from plaita.tasks import Task

logger = logging.getLogger("plaita.flows.engine")

#: The ``error.type`` of an execution whose task killed its worker process ``--max-crashes`` times.
WORKER_CRASHED = "WorkerCrashed"
#: How often a pause before a retry looks at the clocks (and a sync one at the lease).
PAUSE_TICK_S = 0.1


class StepWaits:
    """The runner's suspensions, sleeps and retries (mixed into ``FlowRunner``)."""

    _clock: Callable[[], float]
    _rng: random.Random

    def _children_for(self, task: Task) -> Children:
        raise NotImplementedError

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
        raise NotImplementedError

    async def _succeeded(self, run: Run, step: Step, ctx: StepContext, value: Any, started_s: float) -> None:
        raise NotImplementedError

    async def _suspended(self, run: Run, step: Step, ctx: StepContext, value: Suspend, started_s: float) -> None:
        now_s = self._clock()
        if isinstance(value, Sleep):
            await self._sleep(run, step, ctx, value, started_s, now_s)
            return
        deadline_s = None if value.timeout_s is None else now_s + value.timeout_s
        ex = run.execution.suspended(step.name, ctx.state, ctx.attempt, started_s, now_s, deadline_s, value.wait_for)
        if isinstance(value, Spawn):  # start its children (plaita.flows.children), then wait on them
            ex = await call_io(run.offload, self._children_for(run.task).spawn, run, step.name, value, ex)
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
            joined = await call_io(run.offload, self._children_for(run.task).settled, run)  # all ended meanwhile?
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
            if run.offload:
                await asyncio.sleep(min(PAUSE_TICK_S, left_s))
            else:
                cancelled.wait(min(PAUSE_TICK_S, left_s))
        lost = cancelled.is_set()
        if lost:
            raise LeaseLostError(f"lease of execution {run.task.execution_id} lost while waiting to retry")
