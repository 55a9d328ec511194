"""Flows of "service v1" for the mixed-fleet tests (tests/flows/test_upgrades.py).

``up`` v1: two steps that each wait for an event. ``busy``: one step that holds its slot
``params.s`` seconds (so a worker can be kept from reading). ``only_v1``: a flow only v1 loads.
"""

from __future__ import annotations

import time
from typing import Any

from plaita.flows import Flow
from tests.flows.flowdefs import client

up = Flow("up", version="1")


def wait_for_event(ctx: Any) -> Any:
    if ctx.resume is None:
        return ctx.suspend(timeout_s=600)
    client().rpush(f"plaita:test:up:{ctx.execution_id}", f"{ctx.step}@v1")
    return {ctx.step: ctx.resume.data}


up.step(name="wait1")(wait_for_event)
up.step(name="wait2")(wait_for_event)

busy = Flow("busy")


@busy.step
def hold(ctx: Any) -> Any:
    client().set(f"plaita:test:busy:{ctx.execution_id}", "1")
    time.sleep(float(ctx.params.get("s", 1.0)))
    return {"held": True}


only_v1 = Flow("only_v1")


@only_v1.step
def one(ctx: Any) -> Any:
    client().incr(f"plaita:test:only_v1:{ctx.execution_id}")
    return {"by": "v1"}


FLOWS = [up, busy, only_v1]
