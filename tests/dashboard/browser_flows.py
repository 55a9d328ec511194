"""Flows of the dashboard's browser test (``test_browser.py``): one of each thing the overview
counts, run by a real flow worker (``--flows tests.dashboard.browser_flows``)."""

from __future__ import annotations

import time
from typing import Any

from plaita.flows import Flow, NonRetryableError, StepContext

checkout = Flow("checkout")


@checkout.step
def reserve(ctx: StepContext) -> Any:
    time.sleep(float(ctx.params.get("hold_s", 0.05)))  # a duration the p50/p95 columns show
    return {"reserved": True}


@checkout.step
def charge(ctx: StepContext) -> Any:
    if ctx.params.get("declined"):
        raise NonRetryableError("card declined")
    return {"charged": True}


approval = Flow("approval")


@approval.step
def ask(ctx: StepContext) -> Any:
    if ctx.resume is None:
        return ctx.suspend(wait_for="approve")
    return {"approved": ctx.resume.data}


reminder = Flow("reminder")


@reminder.step
def later(ctx: StepContext) -> Any:
    return ctx.sleep(3600)


@reminder.step
def remind(ctx: StepContext) -> Any:
    return None


leaf = Flow("leaf")


@leaf.step
def hear(ctx: StepContext) -> Any:
    return {"heard": ctx.recv("go")}


fanout = Flow("fanout")


@fanout.step
def fan(ctx: StepContext) -> Any:
    if ctx.children is None:
        return ctx.spawn("leaf", [{"n": n} for n in range(int(ctx.params.get("n", 3)))])
    return {"children": len(ctx.children)}


export = Flow("export", max_concurrent=1)


@export.step
def dump(ctx: StepContext) -> Any:
    time.sleep(float(ctx.params.get("hold_s", 30)))  # holds the one slot: the others wait for it
    return None


FLOWS = [checkout, approval, reminder, leaf, fanout, export]
