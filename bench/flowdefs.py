"""Flows for ``bench/flows.py``, importable by subprocess workers (``--flows bench.flowdefs``)."""

from __future__ import annotations

import os
import time

import redis

from plaita.errors import ConfigError
from plaita.flows import Flow, StepContext

noop3 = Flow("bench-noop3")


@noop3.step
def a(ctx: StepContext) -> None:
    pass


@noop3.step
def b(ctx: StepContext) -> None:
    pass


@noop3.step
def c(ctx: StepContext) -> None:
    pass


slow = Flow("bench-slow")
_clients: dict[str, redis.Redis] = {}


def _client() -> redis.Redis:
    url = os.environ["PLAITA_BENCH_REDIS_URL"]
    if url not in _clients:
        _clients[url] = redis.Redis.from_url(url, socket_timeout=5)
    return _clients[url]


@slow.step
def first(ctx: StepContext) -> None:
    pass


@slow.step
def hang(ctx: StepContext) -> None:
    """On its first run: say which process runs it, then wait to be killed (bounded: 60 s)."""
    if int(_client().incr(f"bench:flows:hang:{ctx.execution_id}")) == 1:  # type: ignore[arg-type]
        _client().set(f"bench:flows:hanging:{ctx.execution_id}", os.getpid())
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not ctx.cancelled:
            time.sleep(0.05)


@slow.step
def last(ctx: StepContext) -> None:
    pass


FLOWS = [noop3, slow]


# -- fan-out (``bench/fanout.py``): a parent spawning N children of one trivial step --------
kid = Flow("bench-kid")


@kid.step
def kid_step(ctx: StepContext) -> dict[str, int]:
    return {"item": int(ctx.params["item"])}


fan = Flow("bench-fan")


@fan.step
def spread(ctx: StepContext) -> object:
    if ctx.children is None:
        return ctx.spawn("bench-kid", [{"item": i} for i in range(int(ctx.params["n"]))])
    return {"ok": sum(1 for c in ctx.children if c.ok)}


FLOWS += [kid, fan]


# -- the same 3-step no-op flow with ``async def`` steps (``bench/flowcurve.py``) ----------
noop3_async = Flow("bench-noop3-async")


@noop3_async.step
async def a_async(ctx: StepContext) -> None:
    pass


@noop3_async.step
async def b_async(ctx: StepContext) -> None:
    pass


@noop3_async.step
async def c_async(ctx: StepContext) -> None:
    pass


FLOWS += [noop3_async]


# -- the same 3-step no-op flow with sync steps run on the loop (``inline=True``: no thread hop) --
noop3_inline = Flow("bench-noop3-inline")
_step_options: dict[str, bool] = {"inline": True}
try:  # a tree from before inline steps (a bench's baseline) imports this file too: its steps on threads
    Flow("bench-probe").step(inline=True)(lambda ctx: None)
except ConfigError:
    _step_options = {}


@noop3_inline.step(**_step_options)
def a_inline(ctx: StepContext) -> None:
    pass


@noop3_inline.step(**_step_options)
def b_inline(ctx: StepContext) -> None:
    pass


@noop3_inline.step(**_step_options)
def c_inline(ctx: StepContext) -> None:
    pass


FLOWS += [noop3_inline]
