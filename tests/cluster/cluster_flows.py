"""Flows for the cluster tier: two steps each staging an INCRBY in the execution's slot, and more."""

from __future__ import annotations

import os
import time
from typing import Any

from plaita.flows import Flow, StepContext
from tests.support.lease_workers import server_client

tally = Flow("tally")


def _tally(ctx: StepContext) -> dict[str, Any]:
    ctx.stage_incr(ctx.key(f"plaita:test:tally:{ctx.execution_id}"))
    ctx.publish(f"ran_{ctx.step}", ctx.params.get("n"))  # one fenced script in the execution's slot
    return {ctx.step: ctx.params.get("n")}


@tally.step
def one(ctx: StepContext) -> dict[str, Any]:
    return _tally(ctx)


@tally.step
def two(ctx: StepContext) -> dict[str, Any]:
    return _tally(ctx)


nap = Flow("nap")


@nap.step
def sleep(ctx: StepContext) -> Any:
    if ctx.resume is None:
        return ctx.suspend(timeout_s=ctx.params.get("timeout_s"))
    return {"resumed_by": ctx.resume.type}


fan = Flow("fan")


@fan.step
def spread(ctx: StepContext) -> Any:
    """``params.n`` ``tally`` children (on every master's slots), joined in order."""
    if ctx.children is None:
        return ctx.spawn("tally", [{"n": i} for i in range(int(ctx.params["n"]))])
    ctx.stage_incr(ctx.key(f"plaita:test:joined:{ctx.execution_id}"))
    return {"outcomes": [[c.execution_id, c.status, c.result] for c in ctx.children]}


#: One slot fleet-wide: its executions live on every partition (every master), its limit spans them.
capped = Flow("capped", max_concurrent=1)
_ENTER = """
local n = redis.call('INCR', KEYS[1])
if n > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], n) end
return n
"""


@capped.step
def hold(ctx: StepContext) -> None:
    client = server_client(os.environ["PLAITA_TEST_REDIS_URL"])
    try:
        client.eval(_ENTER, 2, "plaita:test:{capped}:running", "plaita:test:{capped}:max")
        ctx.cancel.wait(0.1)
        client.decr("plaita:test:{capped}:running")
    finally:
        client.close()


#: One execution per customer at a time, fleet-wide: its slots live in the flow's own hash tag
#: while its executions live on every master. Counts per customer; a gated one holds its key
#: until the test sets ``plaita:test:{keyedc}:gate`` (bounded: 60 s).
keyedc = Flow("keyedc", max_concurrent_per_key=1, concurrency_key="customer")


@keyedc.step
def hold_key(ctx: StepContext) -> None:
    client = server_client(os.environ["PLAITA_TEST_REDIS_URL"])
    running, most = (f"plaita:test:{{keyedc}}:{kind}:{ctx.params['customer']}" for kind in ("running", "max"))
    try:
        client.eval(_ENTER, 2, running, most)
        deadline = time.monotonic() + 60
        while ctx.params.get("gate") and not client.exists("plaita:test:{keyedc}:gate") and time.monotonic() < deadline:
            ctx.cancel.wait(0.02)
        ctx.cancel.wait(float(ctx.params.get("hold_s", 0)))
        client.decr(running)
    finally:
        client.close()
