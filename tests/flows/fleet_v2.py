"""Flows of "service v2" (tests/flows/test_upgrades.py): ``up`` v2 adds a step at the end and
declares v1 compatible; ``busy`` as in v1 and ``busy_v2`` (v2 only); ``only_v2`` instead of
``only_v1``."""

from __future__ import annotations

import time
from typing import Any

from plaita.flows import Flow
from tests.flows.flowdefs import client

up = Flow("up", version="2", compatible_with=("1",))


def wait_for_event(ctx: Any) -> Any:
    if ctx.resume is None:
        return ctx.suspend(timeout_s=600)
    client().rpush(f"plaita:test:up:{ctx.execution_id}", f"{ctx.step}@v2")
    return {ctx.step: ctx.resume.data}


up.step(name="wait1")(wait_for_event)
up.step(name="wait2")(wait_for_event)


@up.step
def extra(ctx: Any) -> Any:
    client().rpush(f"plaita:test:up:{ctx.execution_id}", "extra@v2")
    return {"extra": True}


busy = Flow("busy")


@busy.step
def hold(ctx: Any) -> Any:
    client().set(f"plaita:test:busy:{ctx.execution_id}", "1")
    time.sleep(float(ctx.params.get("s", 1.0)))
    return {"held": True}


#: Only v2 loads it: a v1 worker that reads it hands it to v2, so it always keeps v2 busy.
busy_v2 = Flow("busy_v2")
busy_v2.step(name="hold")(hold)

only_v2 = Flow("only_v2")


@only_v2.step
def two(ctx: Any) -> Any:
    client().incr(f"plaita:test:only_v2:{ctx.execution_id}")
    return {"by": "v2"}


FLOWS = [up, busy, busy_v2, only_v2]
