"""``invoke`` of an ``async def`` step on the caller's loop: its first stretch runs at once, the
rest (if it waits) in a task of its own; either way the step sees one context of its own, its
value or its raise comes back as an ``Attempt``, and a cancel of the runner reaches the step."""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any

import pytest

from plaita.flows.runner.invoke import Attempt, invoke

_var: contextvars.ContextVar[str] = contextvars.ContextVar("_var", default="unset")


def _no_thread_loop() -> asyncio.AbstractEventLoop:
    raise AssertionError("offloaded steps never ask for a thread loop")


def run(step: Any) -> Attempt:
    async def main() -> Attempt:
        return await invoke(step, None, on_loop=True, thread_loop=_no_thread_loop)

    return asyncio.run(main())


def test_a_step_that_never_waits_returns_its_value() -> None:
    async def step(ctx: Any) -> int:
        return 7

    assert run(step) == Attempt(7)


@pytest.mark.parametrize("wait", ["sleep0", "future", "task"])
def test_a_step_that_waits_goes_on_where_it_stopped_in_its_own_context(wait: str) -> None:
    async def step(ctx: Any) -> tuple[str, str]:
        _var.set("step")
        before = _var.get()
        if wait == "sleep0":
            await asyncio.sleep(0)
        elif wait == "future":
            future = asyncio.get_running_loop().create_future()
            asyncio.get_running_loop().call_soon(future.set_result, None)
            await future
        else:
            await asyncio.ensure_future(asyncio.sleep(0))
        return before, _var.get()

    async def main() -> tuple[Attempt, str]:
        attempt = await invoke(step, None, on_loop=True, thread_loop=_no_thread_loop)
        return attempt, _var.get()

    attempt, caller_sees = asyncio.run(main())
    assert attempt == Attempt(("step", "step"))
    assert caller_sees == "unset"  # the step's context is its own, as a task's is


@pytest.mark.parametrize("where", ["before", "after"])
def test_a_raise_before_or_after_a_wait_is_a_failed_attempt(where: str) -> None:
    async def step(ctx: Any) -> None:
        if where == "after":
            await asyncio.sleep(0)
        raise KeyError("boom")

    attempt = run(step)
    assert isinstance(attempt.raised, KeyError)


def test_an_exception_a_future_throws_in_stays_with_the_step() -> None:
    async def step(ctx: Any) -> None:
        future = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_soon(future.set_exception, GeneratorExit())
        await future

    attempt = run(step)
    assert isinstance(attempt.raised, GeneratorExit)


def test_a_cancel_of_the_runner_reaches_a_waiting_step() -> None:
    """The step's task takes the cancel (as before this split): its CancelledError is the
    step's failed attempt, handed back to the runner like any other raise."""
    seen: list[str] = []

    async def step(ctx: Any) -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    async def main() -> Attempt:
        runner = asyncio.ensure_future(invoke(step, None, on_loop=True, thread_loop=_no_thread_loop))
        for _ in range(10):  # bounded: let the step reach its sleep
            await asyncio.sleep(0)
        runner.cancel()
        return await runner

    attempt = asyncio.run(main())
    assert seen == ["cancelled"]
    assert isinstance(attempt.raised, asyncio.CancelledError)
