"""Flows for the flow ACL tests (``--flows tests.ops.acl_flows``): between them they use every
Redis path of a flow worker with an embedded keeper. They touch Redis only through their
contexts (the test user may reach nothing else); staged counters live under ``plaita:test:acl:``."""

from __future__ import annotations

from typing import Any

from plaita.flows import Flow, NonRetryableError, Schedule, StepContext

#: The longest a step here waits (a test that forgets to cancel or resume must not hang).
MAX_WAIT_S = 30.0

kid = Flow("acl-kid")


@kid.step
def work(ctx: StepContext) -> dict[str, int]:
    return {"x2": 2 * int(ctx.params["item"])}


parent = Flow("acl-parent")


@parent.step
def spread(ctx: StepContext) -> Any:
    if ctx.children is None:
        return ctx.spawn("acl-kid", [{"item": i} for i in range(int(ctx.params.get("n", 3)))])
    ctx.state["sum"] = sum(int(c.result["x2"]) for c in ctx.children if c.result)
    return None


@parent.step
def nap(ctx: StepContext) -> Any:
    ctx.publish("progress", {"sum": ctx.state["sum"]})
    if ctx.resume is None:
        return ctx.sleep(float(ctx.params.get("sleep_s", 0.3)))
    return None


@parent.step
def tally(ctx: StepContext) -> dict[str, Any]:
    ctx.stage_incr(ctx.key("plaita:test:acl:tally"))
    ctx.stage_push(ctx.key("plaita:test:acl:done"), ctx.execution_id, ttl_s=600)
    return {"sum": ctx.state["sum"]}


limited = Flow("acl-limited", max_concurrent=1, max_starts_per_s=50)


@limited.step
def once(ctx: StepContext) -> dict[str, bool]:
    ctx.stage(ctx.key(f"plaita:test:acl:limited:{ctx.execution_id}"), "1", ttl_s=600)
    return {"ok": True}


waiter = Flow("acl-waiter")


@waiter.step
def wait_event(ctx: StepContext) -> Any:
    """Suspends until resumed with an event (or sleeps past its deadline with ``sleep_s``)."""
    if ctx.resume is None:
        if "sleep_s" in ctx.params:
            return ctx.sleep(float(ctx.params["sleep_s"]))
        return ctx.suspend(timeout_s=MAX_WAIT_S)
    return {"resume": ctx.resume.type, "data": ctx.resume.data}


failing = Flow("acl-failing")


@failing.step
def refuse(ctx: StepContext) -> None:
    raise NonRetryableError("refused on purpose")


ticking = Flow("acl-tick", schedule=Schedule("* * * * * *", missed="skip"))


@ticking.step
def tick(ctx: StepContext) -> dict[str, int]:
    ctx.stage_incr(ctx.key("plaita:test:acl:ticks"))
    return {"tick_s": int(ctx.params["scheduled"]["tick_s"])}


#: One execution per ``who`` at a time: its starts of one key park behind each other.
keyed = Flow("acl-keyed", max_concurrent_per_key=1, concurrency_key="who")


@keyed.step
def one_per_key(ctx: StepContext) -> dict[str, bool]:
    ctx.cancel.wait(0.2)  # held a moment, so the other starts of its key find it busy
    return {"ok": True}
