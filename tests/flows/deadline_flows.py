"""Flows of the deadline and events tests, for harnesses and worker processes
(``--flows tests.flows.deadline_flows``). Every wait in a step is bounded and ends early on a
cancel; ledgers as in ``tests.flows.flowdefs`` (every run of a step counts)."""

from __future__ import annotations

import time
from typing import Any

from plaita.flows import Flow, StepContext
from tests.flows.flowdefs import _count, client

#: The longest any step here waits for the test (a test that forgets to release must not hang).
MAX_WAIT_S = 30.0


def release_key(eid: str) -> str:
    return f"plaita:test:release:{eid}"


def _wait_released(ctx: StepContext) -> bool:
    """Wait (bounded) until the test sets the release key or the step is cancelled."""
    deadline_s = time.monotonic() + MAX_WAIT_S
    while time.monotonic() < deadline_s:
        if client().exists(release_key(ctx.execution_id)):
            return True
        if ctx.cancel.wait(0.02):
            return False
    return False


long_step = Flow("long_step")


@long_step.step
def grind(ctx: StepContext) -> dict[str, Any]:
    """Runs until released or cancelled (its deadline passing cancels it)."""
    _count(ctx)
    released = _wait_released(ctx)
    return {"released": released, "cut": ctx.cancelled}


@long_step.step
def after(ctx: StepContext) -> dict[str, Any]:
    _count(ctx)
    return {"after": True}


waiter = Flow("waiter")


@waiter.step
def wait_event(ctx: StepContext) -> Any:
    """Suspends without a timeout until an event comes."""
    _count(ctx)
    if ctx.resume is None:
        return ctx.suspend()
    return {"got": ctx.resume.data}


dozer = Flow("dozer")


@dozer.step
def doze(ctx: StepContext) -> Any:
    _count(ctx)
    return ctx.sleep(float(ctx.params.get("sleep_s", 3600)))


@dozer.step
def woke(ctx: StepContext) -> dict[str, Any]:
    _count(ctx)
    return {"woke": True}


ticker = Flow("ticker")


@ticker.step
def tick(ctx: StepContext) -> dict[str, Any]:
    """Publishes its progress and a partial result, then waits (bounded) to be released."""
    _count(ctx)
    total = int(ctx.params.get("n", 3))
    for i in range(1, total + 1):
        ctx.set_progress({"done": i, "of": total})
    ctx.publish("partial", {"rows": [1, 2, 3]})
    released = _wait_released(ctx)
    ctx.publish("partial", {"rows": [1, 2, 3, 4], "final": True})
    return {"released": released}


stubborn = Flow("stubborn")


@stubborn.step(max_attempts=5, base_s=60, cap_s=60)
def insist(ctx: StepContext) -> None:
    """Fails with a minute between attempts: a deadline must not wait that out."""
    _count(ctx)
    raise RuntimeError("not yet")


FLOWS = [long_step, waiter, dozer, ticker, stubborn]
