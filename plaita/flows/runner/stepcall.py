"""Where a step's function runs: on the worker's threads and loop (the default), or in a child
process of ``--pool process`` (``plaita.runtime.procpool``); and its time limit.

The runner around it is the same either way: it builds the ``StepContext``, and after the call
checkpoints what the step returned, left in ``ctx.state``, chose with ``ctx.goto`` and staged with
``ctx.stage*``. In a child those four travel back with the result (they only record into the
context); the rest of the context crosses as data (params, state, results, resume, attempt, ids,
deadline). Two things are live: the cancel flag (the parent forwards it, then kills the child
after a short grace) and ``ctx.publish`` (a call into the worker process, which writes it).

Time limits: in a child the step is killed at its limit (``StepTimeLimit``); on a thread nothing
can stop it, so the limit is soft: ``ctx.cancel`` is set at the limit (``plaita.flows.runner.watch``,
within its 0.1 s tick) so that a cooperative step can return early, the step runs to its end,
holding its slot, and its result is discarded for ``StepTimeLimit``. Either way a failed
attempt: the retry policy applies.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from plaita.errors import StepTimeLimit
from plaita.flows.model.context import Receiving, StepContext
from plaita.flows.model.definition import Step, StepFn
from plaita.flows.runner.invoke import Attempt, invoke, run_here
from plaita.runtime.procchild import ChildServices
from plaita.runtime.procpool import ProcessPool
from plaita.store.executions.staged import Staged

#: The context fields that cross into a child as they are (the rest are live or recorded).
_FIELDS = ("execution_id", "flow_id", "step", "params", "state", "results", "resume", "attempt", "deadline_at")


@dataclass(frozen=True)
class StepResult:
    """What a step run in a child left in its context, with its return value."""

    value: Any
    state: dict[str, Any]
    next_step: str | None
    staged: tuple[Staged, ...]


@dataclass(frozen=True)
class StepJob:
    """One step run, as sent to a child (pickled: the step function by its module path)."""

    fn: StepFn
    fields: dict[str, Any]

    def __call__(self, services: ChildServices) -> StepResult:
        publish = services.request
        ctx = StepContext(**self.fields, cancel=services.cancel, publisher=lambda n, v: publish("publish", n, v))
        attempt = run_here(self.fn, ctx, lambda: services.loop)
        value = attempt.value
        if isinstance(attempt.raised, Receiving):  # a recv's wait keeps what the step left, as on a thread
            value = attempt.raised.suspension
        elif attempt.raised is not None:
            raise attempt.raised
        return StepResult(value, ctx.state, ctx.next_step, tuple(ctx.staged))


def _serve(ctx: StepContext, kind: str, *args: Any) -> Any:
    """A child's live call, run in the worker process on the step's real context."""
    if kind != "publish":
        raise RuntimeError(f"unknown call {kind!r} from a step's child process")
    ctx.publish(*args)


class StepCaller:
    """Calls step functions for the runner: here, or in ``pool`` (``--pool process``)."""

    def __init__(self, pool: ProcessPool | None = None, *, time_limit_s: float | None = None) -> None:
        self.pool = pool
        #: The worker's ``--step-time-limit-s``: for steps without a ``time_limit_s`` of their own.
        self.time_limit_s = time_limit_s

    def limit_of(self, step: Step) -> float | None:
        return step.time_limit_s if step.time_limit_s is not None else self.time_limit_s

    def soft_limit_of(self, step: Step) -> float | None:
        """The limit past which ``ctx.cancel`` is set for a cooperative step: on a thread only (a
        child is killed at its limit instead, and a cancel there would be a ``StepCancelled``)."""
        return self.limit_of(step) if self.pool is None else None

    def call(
        self, step: Step, ctx: StepContext, *, on_loop: bool, thread_loop: Callable[[], asyncio.AbstractEventLoop]
    ) -> Awaitable[Attempt]:
        """Run ``step`` once with ``ctx`` (to await); whatever it raised comes back in the ``Attempt``."""
        if self.pool is None and self.limit_of(step) is None:  # most steps: ``invoke`` itself, no coroutine around it
            return invoke(
                step.fn, ctx, on_loop=on_loop, thread_loop=thread_loop, is_async=step.is_async, inline=step.inline
            )
        return self._call(step, ctx, on_loop=on_loop, thread_loop=thread_loop)

    async def _call(
        self, step: Step, ctx: StepContext, *, on_loop: bool, thread_loop: Callable[[], asyncio.AbstractEventLoop]
    ) -> Attempt:
        limit_s = self.limit_of(step)
        if self.pool is None:
            began_s = time.monotonic()
            attempt = await invoke(
                step.fn, ctx, on_loop=on_loop, thread_loop=thread_loop, is_async=step.is_async, inline=step.inline
            )
            return _soft_limit(attempt, limit_s, time.monotonic() - began_s)
        job = StepJob(step.fn, {name: getattr(ctx, name) for name in _FIELDS} | {"slot_tag": ctx.slot_tag})
        serve = functools.partial(_serve, ctx)
        try:
            if on_loop:  # on the runner's loop: the loop waits for the child's pipe itself
                result = await self.pool.run_async(job, cancel=ctx.cancel, time_limit_s=limit_s, on_request=serve)
            else:
                result = self.pool.run(job, cancel=ctx.cancel, time_limit_s=limit_s, on_request=serve)
        except BaseException as exc:  # noqa: B036 - the step's raise, or its child's death: a failed attempt
            return Attempt(raised=exc)
        ctx.state, ctx.next_step, ctx.staged = result.state, result.next_step, list(result.staged)
        return Attempt(result.value)

    async def hook(
        self,
        fn: Callable[[Any], Any],
        execution: Any,
        *,
        on_loop: bool,
        thread_loop: Callable[[], asyncio.AbstractEventLoop],
    ) -> Attempt:
        """Call a flow's hook with ``execution`` here, like a step: any BaseException comes back
        in the ``Attempt`` (a hook's bug must not fail a task whose execution is already over)."""
        return await invoke(fn, execution, on_loop=on_loop, thread_loop=thread_loop)


def _soft_limit(attempt: Attempt, limit_s: float | None, took_s: float) -> Attempt:
    """On a thread: a step that returned after its limit has failed that attempt anyway."""
    if limit_s is None or took_s <= limit_s or attempt.raised is not None:
        return attempt
    return Attempt(
        raised=StepTimeLimit(
            f"ran {took_s:.3f} s, past its time limit of {limit_s:g} s (on a thread the limit is soft: "
            "the step ran to its end and its result was discarded)"
        )
    )
