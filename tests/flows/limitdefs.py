"""Flows with fleet-wide limits, importable by subprocess workers (``--flows tests.flows.limitdefs``).

A ``hold`` step counts the steps running at once across every worker in Redis
(``plaita:test:limit:running:{flow}``) and keeps the highest count seen
(``plaita:test:limit:max:{flow}``), both updated atomically, so a test reads the observed
concurrency without trusting any clock. Every run is counted in ``flowdefs``' ledger.
"""

from __future__ import annotations

import time
from typing import Any

from plaita.flows import Flow, StepContext
from tests.flows.flowdefs import client

#: INCR the running count and raise the maximum to it, in one call.
_ENTER = """
local n = redis.call('INCR', KEYS[1])
if n > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], n) end
return n
"""


def suspend_once(ctx: StepContext) -> Any:
    """A step that waits for one resume, then passes: its execution holds its slot (or its key's)
    until the test resumes it."""
    return ctx.suspend() if ctx.resume is None else None


def running_key(flow_id: str) -> str:
    return f"plaita:test:limit:running:{flow_id}"


def max_key(flow_id: str) -> str:
    return f"plaita:test:limit:max:{flow_id}"


def starts_key(flow_id: str) -> str:
    return f"plaita:test:limit:starts:{flow_id}"


def _hold(ctx: StepContext) -> dict[str, Any]:
    c = client()
    n = int(c.incr(f"plaita:test:ledger:{ctx.execution_id}:{ctx.step}"))  # type: ignore[arg-type]
    if ctx.params.get("block_first") and n == 1:
        # The kill test's victim: it holds its slot until its worker is killed. Not counted as
        # running, so the count stays exact although this run never decrements it.
        c.set(f"plaita:test:blocked:{ctx.execution_id}", "1")
        ctx.cancel.wait(60)
        raise RuntimeError("the victim's first run was meant to be killed")
    c.eval(_ENTER, 2, running_key(ctx.flow_id), max_key(ctx.flow_id))
    try:
        ctx.cancel.wait(float(ctx.params.get("hold_s", 0.2)))
    finally:
        c.decr(running_key(ctx.flow_id))
    return {"held": n}


pair = Flow("pair", max_concurrent=2)
pair.step(name="hold")(_hold)

solo = Flow("solo", max_concurrent=1)
solo.step(name="hold")(_hold)

paced = Flow("paced", max_starts_per_s=4)


@paced.step
def begin(ctx: StepContext) -> None:
    client().rpush(starts_key(ctx.flow_id), repr(time.time()))


def order_key(flow_id: str) -> str:
    return f"plaita:test:limit:order:{flow_id}"


def gate_key(flow_id: str) -> str:
    return f"plaita:test:limit:gate:{flow_id}"


#: Records the order its executions run in; one started with ``gate`` holds its slot until the
#: test sets the flow's gate key (bounded: 60 s).
ordered = Flow("ordered", max_concurrent=1)


@ordered.step
def record(ctx: StepContext) -> None:
    c = client()
    c.rpush(order_key(ctx.flow_id), ctx.execution_id)
    deadline = time.monotonic() + 60
    while ctx.params.get("gate") and not c.exists(gate_key(ctx.flow_id)) and time.monotonic() < deadline:
        ctx.cancel.wait(0.02)


FLOWS = [pair, solo, paced, ordered]


def _gated(ctx: StepContext, scope: str) -> None:
    """Count itself running in ``scope`` (and its highest count), record its start order there,
    and hold until the test sets the gate named by ``params.gate`` (bounded: 60 s)."""
    c = client()
    c.incr(f"plaita:test:ledger:{ctx.execution_id}:{ctx.step}")
    c.rpush(order_key(scope), ctx.execution_id)
    c.eval(_ENTER, 2, running_key(scope), max_key(scope))
    try:
        deadline = time.monotonic() + 60
        gate = ctx.params.get("gate")
        while gate and not c.exists(gate_key(gate)) and time.monotonic() < deadline:
            ctx.cancel.wait(0.02)
    finally:
        c.decr(running_key(scope))


#: One execution per customer at a time; counts per customer (``keyed:<customer>``) and per flow.
keyed = Flow("keyed", max_concurrent_per_key=1, concurrency_key="customer")


@keyed.step
def charge(ctx: StepContext) -> None:
    c = client()
    c.eval(_ENTER, 2, running_key("keyed"), max_key("keyed"))
    try:
        if ctx.params.get("block_first") and int(c.incr(f"plaita:test:blocked-n:{ctx.execution_id}")) == 1:  # type: ignore[arg-type]
            c.set(f"plaita:test:blocked:{ctx.execution_id}", "1")  # the kill test's victim
            ctx.cancel.wait(60)
            raise RuntimeError("the victim's first run was meant to be killed")
        _gated(ctx, f"keyed:{ctx.params['customer']}")
    finally:
        c.decr(running_key("keyed"))


#: Declares one slot; the tests change it at run time (``plaita limits set``).
tunable = Flow("tunable", max_concurrent=1)


@tunable.step
def tuned(ctx: StepContext) -> None:
    _gated(ctx, f"tunable:{ctx.params['phase']}")


FLOWS += [keyed, tunable]
