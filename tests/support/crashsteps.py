"""Steps that kill their own worker process, for the crash-attribution tests (importable by
subprocess workers: ``--flows tests.support.crashsteps``).

Flows ``crash-sync`` (a ``def`` step) and ``crash-async`` (an ``async def`` step), one step each.
``params``: ``crash`` (``exit``: ``os._exit(3)``; ``sigkill``: SIGKILL to itself, as the OOM
killer does; ``segv``: a segfault, ``ctypes.string_at(0)``) after ``crash_after_s``; otherwise the
step holds ``hold_s`` (so innocents are in flight when the poison one kills the process) and
returns. Every run is recorded in ``plaita:test:crash:runs`` (``<execution id> <pid>``) in
$PLAITA_TEST_REDIS_URL.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
from typing import Any

import redis

from plaita.flows import Flow, StepContext

#: Exit status a supervisor sees for each crash kind (``Popen.returncode``).
EXIT_STATUS = {"exit": 3, "sigkill": -signal.SIGKILL, "segv": -signal.SIGSEGV}
RUNS_KEY = "plaita:test:crash:runs"

_clients: dict[str, redis.Redis] = {}


def crash(kind: str) -> None:
    """Kill this process the way ``kind`` says."""
    if kind == "exit":
        os._exit(3)
    if kind == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "segv":
        ctypes.string_at(0)  # reads address 0: SIGSEGV
    raise ValueError(f"unknown crash kind {kind!r}")


def _record(ctx: StepContext) -> None:
    url = os.environ["PLAITA_TEST_REDIS_URL"]
    client = _clients.get(url)
    if client is None:
        client = _clients[url] = redis.Redis.from_url(url, socket_timeout=5)
    client.rpush(RUNS_KEY, f"{ctx.execution_id} {os.getpid()}")


crash_sync = Flow("crash-sync")
crash_async = Flow("crash-async")


@crash_sync.step
def work(ctx: StepContext) -> dict[str, Any]:
    _record(ctx)
    if ctx.params.get("crash"):
        ctx.cancel.wait(float(ctx.params.get("crash_after_s", 0)))
        crash(str(ctx.params["crash"]))
    ctx.cancel.wait(float(ctx.params.get("hold_s", 0)))
    return {"ok": True}


@crash_async.step(name="work")
async def work_async(ctx: StepContext) -> dict[str, Any]:
    await asyncio.to_thread(_record, ctx)
    if ctx.params.get("crash"):
        await asyncio.sleep(float(ctx.params.get("crash_after_s", 0)))
        crash(str(ctx.params["crash"]))
    await asyncio.sleep(float(ctx.params.get("hold_s", 0)))
    return {"ok": True}
