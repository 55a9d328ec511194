"""Flows of the addressed-resume tests (``tests.flows.test_addressed_resumes``): an order that
first waits for an approval (an unaddressed wait, as flows wrote before waits had names), then
for its payment by name, then ships."""

from __future__ import annotations

from typing import Any

from plaita.flows import Flow, StepContext

order = Flow("order")


@order.step
def approve(ctx: StepContext) -> Any:
    if ctx.resume is None:
        return ctx.suspend()
    return {"approved": ctx.resume.data}


@order.step
def await_payment(ctx: StepContext) -> Any:
    if ctx.resume is None:
        return ctx.suspend(timeout_s=600, wait_for="payment")
    return {"paid": ctx.resume.data, "resume_type": ctx.resume.type}


@order.step
def ship(ctx: StepContext) -> dict[str, Any]:
    return {"shipped": True}


napped = Flow("napped")


@napped.step
def nap(ctx: StepContext) -> Any:
    return ctx.sleep(600)


@napped.step
def pay(ctx: StepContext) -> Any:
    if ctx.resume is None:
        return ctx.suspend(wait_for="payment")
    return {"paid": ctx.resume.data}


FLOWS = [order, napped]
