"""Flows of the durable-sleep and retry tests (``--flows tests.flows.sleepdefs``), counting
every step run in the ledger of ``tests.flows.flowdefs``."""

from __future__ import annotations

import time
from typing import Any

from plaita.flows import Flow, NonRetryableError, StepContext
from tests.flows.flowdefs import _count, client

napper = Flow("napper")


@napper.step
def before(ctx: StepContext) -> Any:
    _count(ctx)
    ctx.state["before"] = True  # kept across the sleep
    if "until_s" in ctx.params:
        return ctx.sleep_until(float(ctx.params["until_s"]))
    return ctx.sleep(float(ctx.params.get("sleep_s", 1)))


@napper.step
def after(ctx: StepContext) -> dict[str, Any]:
    _count(ctx)
    client().set(f"plaita:test:woke:{ctx.execution_id}", repr(time.time()))
    return {"resume_seen": None if ctx.resume is None else ctx.resume.type, "kept": ctx.state.get("before")}


nap_last = Flow("nap_last")


@nap_last.step
def only(ctx: StepContext) -> Any:
    _count(ctx)
    return ctx.sleep(float(ctx.params.get("sleep_s", 1)))


fixable = Flow("fixable")


def _publish_first_run(ctx: StepContext, n: int) -> None:
    """With ``params.publish``: the step's first run publishes an event and its progress."""
    if ctx.params.get("publish") and n == 1:
        ctx.publish(f"from_{ctx.step}", {"run": n})
        ctx.set_progress({"step": ctx.step})


@fixable.step
def a(ctx: StepContext) -> dict[str, Any]:
    n = _count(ctx)
    _publish_first_run(ctx, n)
    return {"a": n}


@fixable.step
def b(ctx: StepContext) -> Any:
    n = _count(ctx)
    _publish_first_run(ctx, n)
    if client().exists(f"plaita:test:broken:{ctx.execution_id}"):
        raise NonRetryableError("our bug")
    if n == ctx.params.get("hold_run"):  # this run of b holds until cancelled (a kill -9 target)
        client().set(f"plaita:test:sleeping:{ctx.execution_id}", ctx.step)
        ctx.cancel.wait(60)
    if ctx.params.get("suspend") and ctx.resume is None:
        return ctx.suspend()
    return {"b": n}


@fixable.step
def c(ctx: StepContext) -> dict[str, Any]:
    return {"c": _count(ctx), "seen_a": ctx.results.get("a"), "seen_b": ctx.results.get("b")}


FLOWS = [napper, nap_last, fixable]
