"""Steps and handlers for the ``--pool process`` tests (importable by subprocess workers:
``--flows tests.support.poolsteps`` / ``--handler tests.support.poolsteps:handle``).

Flows ``pool-sync`` (a ``def`` step) and ``pool-async`` (an ``async def`` step), one step ``work``
with a 1 s time limit and 2 attempts 50 ms apart. ``params``: ``fault`` (``exit``, ``sigkill``,
``segv``: ``tests.support.crashsteps.crash``; ``hang``: run ``hang_s`` past the limit, ignoring the
cancel flag; ``polite``: hold up to ``hang_s`` but return once the cancel flag is set, recording
it in ``SAW_LIMIT_KEY``) after ``fault_after_s``; otherwise the step holds ``hold_s`` and returns its pid.
Every run is recorded in ``RUNS_KEY`` (``<execution id> <pid>``) in $PLAITA_TEST_REDIS_URL.

``pool-features`` uses every ``ctx`` operation that must cross the process boundary;
``pool-cancel`` (``max_concurrent=1``) holds until cancelled, cooperatively or not.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any

import redis

from plaita.flows import Flow, StepContext
from plaita.tasks import Task
from tests.support.crashsteps import crash

RUNS_KEY = "plaita:test:pool:runs"
logger = logging.getLogger(__name__)
#: Set by a ``pool-cancel`` step that saw its cancel flag (it crossed into the child).
SAW_CANCEL_KEY = "plaita:test:pool:saw-cancel"
#: Appended to by a ``work`` step (``polite``) that saw its flag set: ``<execution id> <seconds it ran>``.
SAW_LIMIT_KEY = "plaita:test:pool:saw-limit"
#: The time limit of the ``work`` steps.
LIMIT_S = 1.0
_POLICY: dict[str, Any] = {"max_attempts": 2, "base_s": 0.05, "cap_s": 0.05}

_clients: dict[str, redis.Redis] = {}


def client() -> redis.Redis:
    url = os.environ["PLAITA_TEST_REDIS_URL"]
    found = _clients.get(url)
    if found is None:
        found = _clients[url] = redis.Redis.from_url(url, socket_timeout=5, decode_responses=True)
    return found


def _record(name: str) -> None:
    client().rpush(RUNS_KEY, f"{name} {os.getpid()}")


pool_sync = Flow("pool-sync")
pool_async = Flow("pool-async")


@pool_sync.step(time_limit_s=LIMIT_S, **_POLICY)
def work(ctx: StepContext) -> dict[str, Any]:
    _record(ctx.execution_id)
    if ctx.params.get("log"):  # one line at INFO (the worker's default level) and one at DEBUG
        logger.info("step of %s in process %d says %s", ctx.execution_id, os.getpid(), ctx.params["log"])
        logger.debug("step of %s says a DEBUG line", ctx.execution_id)
    fault = ctx.params.get("fault")
    if fault == "hang":
        time.sleep(float(ctx.params["hang_s"]))
    elif fault == "polite":
        began_s = time.monotonic()
        if ctx.cancel.wait(float(ctx.params["hang_s"])):
            client().rpush(SAW_LIMIT_KEY, f"{ctx.execution_id} {time.monotonic() - began_s:.3f}")
    elif fault:
        time.sleep(float(ctx.params.get("fault_after_s", 0)))
        crash(str(fault))
    ctx.cancel.wait(float(ctx.params.get("hold_s", 0)))
    return {"pid": os.getpid()}


@pool_async.step(name="work", time_limit_s=LIMIT_S, **_POLICY)
async def work_async(ctx: StepContext) -> dict[str, Any]:
    await asyncio.to_thread(_record, ctx.execution_id)
    fault = ctx.params.get("fault")
    if fault == "hang":
        await asyncio.sleep(float(ctx.params["hang_s"]))
    elif fault == "polite":
        began_s, until_s = time.monotonic(), time.monotonic() + float(ctx.params["hang_s"])
        while not ctx.cancelled and time.monotonic() < until_s:
            await asyncio.sleep(0.01)
        if ctx.cancelled:
            took_s = time.monotonic() - began_s
            await asyncio.to_thread(client().rpush, SAW_LIMIT_KEY, f"{ctx.execution_id} {took_s:.3f}")
    elif fault:
        await asyncio.sleep(float(ctx.params.get("fault_after_s", 0)))
        crash(str(fault))
    await asyncio.sleep(float(ctx.params.get("hold_s", 0)))
    return {"pid": os.getpid()}


features = Flow("pool-features")


@features.step
def first(ctx: StepContext) -> dict[str, Any]:
    ctx.state["seen"] = ctx.params["n"] * 2
    ctx.stage("plaita:test:pool:staged", "v")
    ctx.stage_incr("plaita:test:pool:count", 5)
    ctx.set_progress(0.5)
    ctx.goto("third")
    return {"pid": os.getpid()}


@features.step
def second(ctx: StepContext) -> None:
    raise RuntimeError("goto skips this step")


@features.step
async def third(ctx: StepContext) -> Any:
    if ctx.resume is None:
        return ctx.suspend(timeout_s=60)
    if ctx.children is None:
        return ctx.spawn("pool-child", [{"n": 1}, {"n": 2}])
    return {"resumed": ctx.attempt, "state": ctx.state["seen"], "sum": sum(c.result["n"] for c in ctx.children)}


@features.step
def fourth(ctx: StepContext) -> Any:
    return ctx.sleep(0.2) if ctx.resume is None else None


@features.step
def last(ctx: StepContext) -> dict[str, Any]:
    return {"first": ctx.results["first"]["pid"], "pid": os.getpid()}


child = Flow("pool-child")


@child.step
def echo(ctx: StepContext) -> dict[str, Any]:
    return {"n": ctx.params["n"]}


cancel_flow = Flow("pool-cancel", max_concurrent=1)


@cancel_flow.step
def hold(ctx: StepContext) -> dict[str, Any]:
    _record(ctx.execution_id)
    if ctx.params.get("cooperative"):
        if ctx.cancel.wait(30):
            client().set(SAW_CANCEL_KEY, ctx.execution_id)
    else:
        time.sleep(float(ctx.params.get("hold_s", 30)))  # deaf to the flag: only a kill ends it
    return {"pid": os.getpid()}


def _behave(task: Task) -> None:
    params = task.body.get("params") or {}
    _record(task.message_id)
    if params.get("fault") == "hang":
        time.sleep(float(params["hang_s"]))
    elif params.get("fault"):
        time.sleep(float(params.get("fault_after_s", 0)))
        crash(str(params["fault"]))
    time.sleep(float(params.get("hold_s", 0)))


def handle(task: Task) -> None:
    """A plain handler: records its run, then faults or holds (``params`` as for the steps)."""
    _behave(task)


async def handle_async(task: Task) -> None:
    """``handle`` as an ``async def`` handler."""
    await asyncio.sleep(0)
    _behave(task)
