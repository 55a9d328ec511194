"""Calling a step so that whatever it raises comes back as a value, never through the runner.

Every ``BaseException`` a step raises is one failed attempt (its retry policy, then ``error``),
so it has to reach the runner as data, whatever Python does with it on the way:

- a sync step run with ``asyncio.to_thread`` could not report a ``StopIteration`` at all (asyncio
  refuses it as a future's exception and the step's coroutine would wait forever), so the
  thread catches everything and returns it;
- an exception that resolves a future an async step awaits is *thrown* into the awaiting task,
  and a thrown ``GeneratorExit`` closes every coroutine of that task up to its root (the
  runner and the pool included). The step therefore runs as a task of its own whose root
  catches everything: the throw stops there;
- ``KeyboardInterrupt`` and ``SystemExit`` leaving a task's root would also stop the event loop
  running every other execution; the same root catches them.

A sync step declared ``inline`` (``Flow.step(inline=True)``) is called on the loop itself, in a
copy of the context as ``asyncio.to_thread`` would run it: no thread hop, the same ``Attempt``.

An ``async def`` step's first stretch (up to its first real wait) runs at once, in a context of
its own as a task would: nothing can be thrown into code that has not awaited yet. Only a step
that does wait goes on in a task of its own, from where it stopped; a step that never waits
(most steps that only compute) costs no task and no turn of the loop.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import types
from collections.abc import Awaitable, Callable, Coroutine, Generator
from typing import Any, NamedTuple


class Attempt(NamedTuple):
    """What one run of a step gave: its value, or what it raised. Immutable; a named tuple, not
    a frozen dataclass, whose ``__init__`` costs an ``object.__setattr__`` per field (every step
    makes one or two)."""

    value: Any = None
    raised: BaseException | None = None


def call(fn: Callable[[Any], Any], ctx: Any) -> Attempt:
    """``fn(ctx)``; whatever it raises is returned (see the module docstring)."""
    try:
        return Attempt(fn(ctx))
    except BaseException as exc:  # noqa: B036 - every raise of step code is a failed attempt
        return Attempt(raised=exc)


async def _settle(awaitable: Awaitable[Any]) -> Attempt:
    try:
        return Attempt(await awaitable)
    except BaseException as exc:  # noqa: B036 - the root of the step's own task: the throw stops here
        return Attempt(raised=exc)


@types.coroutine
def _continued(coro: Coroutine[Any, Any, Any], yielded: Any) -> Generator[Any, Any, Any]:
    """The rest of ``coro`` once its first stretch yielded ``yielded``: what ``yield from coro``
    would do from there (what the driving task sends or throws in goes on to ``coro``)."""
    while True:
        try:
            sent = yield yielded
        except BaseException as exc:  # noqa: B036 - thrown in by the task: a cancel, a future's exception
            try:
                yielded = coro.throw(exc)
            except StopIteration as stop:
                return stop.value
        else:
            try:
                yielded = coro.send(sent)
            except StopIteration as stop:
                return stop.value


def _first_stretch(awaitable: Awaitable[Any]) -> Attempt | asyncio.Future[Attempt]:
    """A step's coroutine run to its first real wait, here: its ``Attempt`` when it got no
    further (most steps), else the task running the rest, to await (see the module docstring).
    A plain function, not a coroutine: a step that never waits costs no coroutine of its own."""
    if not isinstance(awaitable, types.CoroutineType):  # another awaitable: a task from the start
        return asyncio.ensure_future(_settle(awaitable))
    context = contextvars.copy_context()
    try:
        yielded = context.run(awaitable.send, None)
    except StopIteration as stop:
        return Attempt(stop.value)
    except BaseException as exc:  # noqa: B036 - the step's own raise: a failed attempt
        return Attempt(raised=exc)
    rest = _settle(_continued(awaitable, yielded))
    return asyncio.get_running_loop().create_task(rest, context=context)


async def invoke(
    fn: Callable[[Any], Any],
    ctx: Any,
    *,
    on_loop: bool,
    thread_loop: Callable[[], asyncio.AbstractEventLoop],
    is_async: bool | None = None,
    inline: bool = False,
) -> Attempt:
    """Run step ``fn`` once. ``on_loop``: on the caller's loop, sync steps on a thread (on the
    loop itself when ``inline``); otherwise on this thread, an ``async def`` step on
    ``thread_loop()`` (no loop runs here). ``is_async``: whether ``fn`` is an ``async def``
    (``Step.is_async``; None: asked here)."""
    if not on_loop:
        return run_here(fn, ctx, thread_loop)
    if is_async is None:
        is_async = inspect.iscoroutinefunction(fn)
    if is_async:
        attempt = call(fn, ctx)
    elif inline:  # a short, non-blocking sync step: on the loop, in a context of its own as on a thread
        attempt = contextvars.copy_context().run(call, fn, ctx)
    else:
        attempt = await asyncio.to_thread(call, fn, ctx)
    value = attempt.value
    if value is None or attempt.raised is not None or not inspect.isawaitable(value):  # None: most steps
        return attempt
    settled = _first_stretch(value)
    return settled if isinstance(settled, Attempt) else await settled


def run_here(fn: Callable[[Any], Any], ctx: Any, loop: Callable[[], asyncio.AbstractEventLoop]) -> Attempt:
    """Run step ``fn`` once on this thread, where no loop runs: an ``async def`` step to its end
    on ``loop()`` (a handler thread's own loop, or a ``--pool process`` child's)."""
    attempt = call(fn, ctx)
    if attempt.raised is not None or not inspect.isawaitable(attempt.value):
        return attempt
    result: Attempt = loop().run_until_complete(_settle(attempt.value))
    return result
