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
from plaita.flows.children import Children
from plaita.flows.context import Sleep, Spawn, StepContext, Suspend
from plaita.flows.definition import Step
from plaita.flows.execution import Execution
from plaita.flows.failures import describe_exception, error_doc, error_from_exception
from plaita.flows.validate import StepOutputError
from plaita.store.executions import Staged

logger = logging.getLogger("plaita.flows.engine")

#: The ``error.type`` of an execution whose task killed its worker process ``--max-crashes`` times.
WORKER_CRASHED = "WorkerCrashed"


class StepWaits:
    """The runner's suspensions, sleeps and retries (mixed into ``FlowRunner``)."""

    _clock: Callable[[], float]
    _rng: random.Random

    _children: Children

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
        """Checkpoint a failed attempt: the execution fails (None), or the delay before the retry."""
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
        if run.execution.deadline_at is not None:  # no waiting past the deadline: cancelled then
            delay_s = max(0.0, min(delay_s, run.execution.deadline_at - self._clock()))
        return delay_s

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

    async def _pause(self, run: Run, delay_s: float) -> None:
        """Wait ``delay_s`` between attempts; LeaseLostError as soon as the lease is lost."""
        cancelled = run.task.cancelled
        if not run.on_loop:
            lost = cancelled.wait(delay_s)
        else:
            deadline_s = time.monotonic() + delay_s
            while not cancelled.is_set() and (left_s := deadline_s - time.monotonic()) > 0:
                await asyncio.sleep(min(0.1, left_s))
            lost = cancelled.is_set()
        if lost:
            raise LeaseLostError(f"lease of execution {run.task.execution_id} lost while waiting to retry")
