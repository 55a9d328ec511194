"""Flows of the message tests (``tests.flows.test_messages``): ``FlowClient.send`` and ``ctx.recv``."""

from __future__ import annotations

from typing import Any

from plaita.flows import Flow, StepContext

#: How many messages ``inbox`` collects before it completes.
WANTED = 3

inbox = Flow("msg-inbox")


@inbox.step
def gate(ctx: StepContext) -> Any:
    """Waits for ``go`` first, so messages to ``t`` sent meanwhile come before their recv."""
    if ctx.params.get("gate") and ctx.resume is None:
        return ctx.suspend(wait_for="go")
    return None


@inbox.step
def collect(ctx: StepContext) -> Any:
    msg = ctx.recv("t", timeout_s=ctx.params.get("timeout_s", 600))
    got = [*ctx.state.get("got", []), msg]
    ctx.state["got"] = got
    if msg is not None and len(got) < WANTED:
        ctx.goto("collect")  # the next message: this step again, one recv per run
    return {"got": got}


kept = Flow("msg-state")


@kept.step
def count_then_recv(ctx: StepContext) -> Any:
    """Writes its state before the recv: the suspension keeps it (threads and a pool child alike)."""
    ctx.state["runs"] = ctx.state.get("runs", 0) + 1
    msg = ctx.recv("t")
    return {"runs": ctx.state["runs"], "msg": msg}


FLOWS = [inbox, kept]
