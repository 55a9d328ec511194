"""Flows for the tests, importable by subprocess workers (``--flows tests.flows.flowdefs``).

Steps count every run in a ledger in Redis ($PLAITA_TEST_REDIS_URL), written directly (so it
sees every run, at-least-once) and staged (so it commits exactly once with the checkpoint):
``plaita:test:ledger:{eid}:{step}`` and ``plaita:test:staged:{eid}:{step}``.
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis

from plaita.flows import Flow, NonRetryableError, StepContext

_clients: dict[str, redis.Redis] = {}


def client() -> redis.Redis:
    url = os.environ["PLAITA_TEST_REDIS_URL"]
    c = _clients.get(url)
    if c is None:
        c = _clients[url] = redis.Redis.from_url(url, socket_timeout=5, decode_responses=True)
    return c


def ledger(eid: str, step: str, kind: str = "ledger") -> int:
    value = client().get(f"plaita:test:{kind}:{eid}:{step}")
    return int(value) if value is not None else 0


def _count(ctx: StepContext) -> int:
    n = int(client().incr(f"plaita:test:ledger:{ctx.execution_id}:{ctx.step}"))  # type: ignore[arg-type]
    ctx.stage_incr(ctx.key(f"plaita:test:staged:{ctx.execution_id}:{ctx.step}"))
    return n


def _maybe_sleep(ctx: StepContext, n: int) -> None:
    """Sleep ``params.sleep_s`` in the step named ``params.sleep_step`` on its first run only."""
    if ctx.params.get("sleep_step") == ctx.step and n == 1:
        client().set(f"plaita:test:sleeping:{ctx.execution_id}", ctx.step)
        ctx.cancel.wait(float(ctx.params.get("sleep_s", 30)))


ledger3 = Flow("ledger3")


@ledger3.step
def one(ctx: StepContext) -> dict[str, Any]:
    _maybe_sleep(ctx, _count(ctx))
    return {"one": 1}


@ledger3.step
async def two(ctx: StepContext) -> dict[str, Any]:
    n = _count(ctx)
    _maybe_sleep(ctx, n)
    return {"two": ctx.state["one"] + 1}


@ledger3.step
def three(ctx: StepContext) -> dict[str, Any]:
    _maybe_sleep(ctx, _count(ctx))
    return {"three": ctx.state["two"] + 1}


signup = Flow("signup")


@signup.step
def create(ctx: StepContext) -> dict[str, Any]:
    _count(ctx)
    return {"user": ctx.params.get("name", "ann")}


@signup.step
def wait_email(ctx: StepContext) -> Any:
    _count(ctx)
    if ctx.resume is None:
        _maybe_sleep(ctx, 1)
        timeout = ctx.params.get("timeout_s")
        return ctx.suspend(timeout_s=None if timeout is None else float(timeout))
    return {"resumed_by": ctx.resume.type, "email": ctx.resume.data}


@signup.step
def finish(ctx: StepContext) -> dict[str, Any]:
    _count(ctx)
    return {"done": True}


flaky = Flow("flaky")


@flaky.step(max_attempts=3, base_s=0.01, cap_s=0.02)
def wobble(ctx: StepContext) -> dict[str, Any]:
    n = _count(ctx)
    if n <= int(ctx.params.get("fail_times", 0)):
        raise RuntimeError(f"flaky failure {n}")
    if ctx.params.get("fatal"):
        raise NonRetryableError("card declined")
    return {"attempt": ctx.attempt}


bad_result = Flow("bad_result")


@bad_result.step(max_attempts=2, base_s=0.01, cap_s=0.02)
def unserialisable(ctx: StepContext) -> Any:
    return {"when": object()}


big = Flow("big")


@big.step
def grow(ctx: StepContext) -> dict[str, Any]:
    return {"blob": "x" * int(ctx.params.get("size", 10))}


loop = Flow("loop")


@loop.step
def tick(ctx: StepContext) -> dict[str, Any]:
    _count(ctx)
    n = int(ctx.state.get("n", 0)) + 1
    if n < int(ctx.params.get("times", 3)):
        ctx.goto("tick")
    return {"n": n}


@loop.step
def tock(ctx: StepContext) -> dict[str, Any]:
    _count(ctx)
    return {"tocked": True}


patient = Flow("patient")


@patient.step
def linger(ctx: StepContext) -> dict[str, Any]:
    """Wait up to ``params.wait_s`` for the cancel flag; record what it saw."""
    _count(ctx)
    client().set(f"plaita:test:sleeping:{ctx.execution_id}", ctx.step)
    seen = ctx.cancel.wait(float(ctx.params.get("wait_s", 10)))
    client().set(f"plaita:test:saw-cancel:{ctx.execution_id}", int(seen))
    return {"saw_cancel": seen}


@patient.step
def after(ctx: StepContext) -> None:
    _count(ctx)


overlap = Flow("overlap")


@overlap.step
def guarded(ctx: StepContext) -> Any:
    """Counts concurrent runs of any step of this execution (must never exceed 1)."""
    c = client()
    active = int(c.incr(f"plaita:test:active:{ctx.execution_id}"))  # type: ignore[arg-type]
    if active > 1:
        c.incr(f"plaita:test:overlaps:{ctx.execution_id}")
    try:
        _count(ctx)
        time.sleep(float(ctx.params.get("hold_s", 0.5)))
    finally:
        c.decr(f"plaita:test:active:{ctx.execution_id}")
    if ctx.resume is None:
        return ctx.suspend()
    return {"data": ctx.resume.data}


FLOWS = [ledger3, signup, flaky, bad_result, big, loop, patient, overlap]


mixed = Flow("mixed")


@mixed.step
def sync_calls_asyncio_run(ctx: StepContext) -> dict[str, Any]:
    """Sync code that wraps an async library with asyncio.run (needs no running loop here)."""
    import asyncio

    async def fetch() -> int:
        await asyncio.sleep(0)
        return 41

    return {"fetched": asyncio.run(fetch())}


@mixed.step
async def async_awaits(ctx: StepContext) -> dict[str, Any]:
    import asyncio

    await asyncio.sleep(0.01)
    return {"answer": ctx.state["fetched"] + 1}


FLOWS.append(mixed)


refused = Flow("refused")


@refused.step(max_attempts=2, base_s=0.01, cap_s=0.02)
def stage_three(ctx: StepContext) -> dict[str, Any]:
    """Issue 18's half checkpoint: good, a write Redis refuses (a list under INCRBY), good."""
    _count(ctx)
    ctx.stage_incr(ctx.key(f"app:good1:{ctx.execution_id}"))
    ctx.stage_incr(ctx.key(f"app:list:{ctx.execution_id}"))
    ctx.stage_incr(ctx.key(f"app:good2:{ctx.execution_id}"))
    return {"staged": 3}


stamp = Flow("stamp")


@stamp.step(max_attempts=2, base_s=0.01, cap_s=0.02)
def stamp_state(ctx: StepContext) -> None:
    """Issue 18's in-place state that is not JSON."""
    import datetime

    _count(ctx)
    ctx.state["when"] = datetime.datetime.now()


FLOWS += [refused, stamp]
