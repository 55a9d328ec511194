"""Flows with child executions, for worker processes (``--flows tests.flows.fanout_flows``).

``fan`` spawns ``params.n`` ``kid`` children from its step ``spread`` and, once they are joined,
records their outcomes. Ledgers (``tests.flows.flowdefs``): every run of a step counts in
``plaita:test:ledger:{eid}:{step}``, exactly once per checkpoint in ``plaita:test:staged:…``;
each join of a parent counts in ``plaita:test:joins:{eid}`` (direct) and ``…:joined:…`` (staged).
"""

from __future__ import annotations

import time
from typing import Any

from plaita.flows import Flow, NonRetryableError, StepContext
from tests.flows.flowdefs import _count, client

kid = Flow("kid")


@kid.step
def work(ctx: StepContext) -> Any:
    runs = _count(ctx)
    if ctx.params.get("hold_first") and runs == 1:
        # Its first run stays in the step until the test releases it (bounded): a kill of its
        # worker is then surely a kill mid-step.
        release, deadline_s = f"plaita:test:release:{ctx.execution_id}", time.monotonic() + 60
        while not client().exists(release) and time.monotonic() < deadline_s and not ctx.cancel.wait(0.02):
            pass
    if ctx.params.get("wait") and ctx.resume is None:
        return ctx.suspend()  # waits for an event (or a cancel)
    if ctx.params.get("sleep_s"):
        ctx.cancel.wait(float(ctx.params["sleep_s"]))
    if ctx.params.get("fail"):
        raise NonRetryableError(f"item {ctx.params['item']} cannot ship")
    return {"item": ctx.params["item"], "x2": 2 * int(ctx.params["item"])}


fan = Flow("fan")


@fan.step
def spread(ctx: StepContext) -> Any:
    children = ctx.children
    if children is None:
        _count(ctx)
        failing = set(ctx.params.get("fail", []))
        extra = ctx.params.get("child", {})
        items = [{"item": i, "fail": i in failing, **extra} for i in range(int(ctx.params["n"]))]
        for i in ctx.params.get("hold_first", []):
            items[i]["hold_first"] = True
        return ctx.spawn("kid", items)
    client().incr(f"plaita:test:joins:{ctx.execution_id}")
    ctx.stage_incr(ctx.key(f"plaita:test:joined:{ctx.execution_id}"))
    return {"outcomes": [[c.execution_id, c.status, c.result, (c.error or {}).get("type")] for c in children]}


@fan.step
def summary(ctx: StepContext) -> dict[str, Any]:
    return {"ok": sum(1 for o in ctx.state["outcomes"] if o[1] == "completed")}


rounds = Flow("rounds")


@rounds.step
def twice(ctx: StepContext) -> Any:
    """Spawns two ``kid`` children, then, once joined, two more from the same step; records
    what the second join saw. ``plaita:test:rounds:{eid}`` counts the joins the step ran."""
    children = ctx.children
    if children is None:
        return ctx.spawn("kid", [{"item": i} for i in range(2)])
    if client().incr(f"plaita:test:rounds:{ctx.execution_id}") == 1:
        return ctx.spawn("kid", [{"item": 10 + i} for i in range(2)])
    return {"seen": [[c.execution_id, (c.result or {}).get("item")] for c in children]}


FLOWS = [kid, fan, rounds]
