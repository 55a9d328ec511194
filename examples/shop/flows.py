"""An order pipeline: reserve, wait for the payment, ship each line, remind three days later.

Run it with one command from a clone's root (an embedded server, a worker, a keeper and the
dashboard)::

    plaita dev --flows examples.shop.flows
    plaita executions start order --input '{"order_id": "o-1", "lines": [{"sku": "mug", "qty": 2, "price_cents": 900}]}'
    plaita executions resume ID --wait-for payment --data '{"amount_cents": 1800}'

What it shows, each with the API that does it (docs/flows.md):

- ``order`` suspends in ``await_payment`` for an event addressed to the wait ``payment``
  (``ctx.suspend(wait_for="payment")``, ``FlowClient.resume(..., wait_for="payment")``), a day at most;
- ``ship_lines`` fans out one ``ship_line`` child per order line and joins them (``ctx.spawn``);
- ``ship_line`` has a fleet-wide limit (``max_concurrent``: two lines are booked at once) and
  a retry policy whose backoff is half a minute (the carrier may be briefly down);
- ``wait_for_review`` sleeps three days durably (``ctx.sleep``), then ``remind_review`` runs;
- ``daily_report`` starts by itself every day at 06:00 UTC (a ``Schedule``, run by the keeper).

examples/shop/tests/ tests all of it with ``plaita.testing`` in a few seconds.
"""

from __future__ import annotations

from typing import Any

from plaita import Flow, NonRetryableError, Schedule, StepContext

#: How long an order waits for its payment before it is given up.
PAYMENT_TIMEOUT_S = 24 * 3600
#: How long after shipping the customer is asked for a review.
REVIEW_DELAY_S = 3 * 86400
#: A carrier's booking is retried this long after a failure (then twice that, ...).
CARRIER_RETRY_BASE_S = 30.0
#: Staged keys: units reserved so far, and the orders whose customer was reminded.
RESERVED_KEY = "shop:reserved-units"
REMINDERS_KEY = "shop:reminders"

order = Flow("order")
ship_line = Flow("ship_line", max_concurrent=2)
daily_report = Flow("daily_report", schedule=Schedule("0 6 * * *"))


class CarrierDown(Exception):
    """The carrier's booking service failed: worth another attempt."""


@order.step
def reserve(ctx: StepContext) -> dict[str, Any]:
    lines = ctx.params.get("lines") or []
    if not lines or any(int(line.get("qty", 0)) < 1 for line in lines):
        raise NonRetryableError("an order needs at least one line, each with a quantity of 1 or more")
    # Exactly once, with this step's checkpoint: a rerun of the step never reserves twice.
    ctx.stage_incr(RESERVED_KEY, sum(int(line["qty"]) for line in lines))
    total = sum(int(line["qty"]) * int(line.get("price_cents", 0)) for line in lines)
    return {"total_cents": total}


@order.step
def await_payment(ctx: StepContext) -> Any:
    if ctx.resume is None:
        return ctx.suspend(timeout_s=PAYMENT_TIMEOUT_S, wait_for="payment")
    if ctx.resume.type == "timeout":
        raise NonRetryableError("not paid within a day: the reservation is released")
    paid = (ctx.resume.data or {}).get("amount_cents")
    if paid != ctx.state["total_cents"]:
        raise NonRetryableError(f"paid {paid} cents for an order of {ctx.state['total_cents']}")
    return {"paid_cents": paid}


@order.step
def ship_lines(ctx: StepContext) -> Any:
    if ctx.children is None:  # first run: one child per line, then wait for all of them
        lines = ctx.params["lines"]
        return ctx.spawn("ship_line", [{"order_id": ctx.params.get("order_id"), **line} for line in lines])
    failed = [c.execution_id for c in ctx.children if not c.ok]
    if failed:
        raise NonRetryableError(f"lines not shipped: {failed}")
    return {"tracking": [c.result["tracking"] for c in ctx.children]}


@order.step
def wait_for_review(ctx: StepContext) -> Any:
    return ctx.sleep(REVIEW_DELAY_S)  # durable: no thread, no lease; a worker restart changes nothing


@order.step
def remind_review(ctx: StepContext) -> dict[str, Any]:
    ctx.stage_push(REMINDERS_KEY, ctx.params.get("order_id"))
    return {"reminded": True}


@ship_line.step(max_attempts=3, base_s=CARRIER_RETRY_BASE_S)
def book_carrier(ctx: StepContext) -> dict[str, Any]:
    if ctx.params.get("carrier_fails", 0) >= ctx.attempt:  # a test's way to make the carrier fail
        raise CarrierDown(f"carrier down (attempt {ctx.attempt})")
    return {"tracking": f"TRK-{ctx.params.get('order_id')}-{ctx.params['sku']}"}


@daily_report.step
def report(ctx: StepContext) -> dict[str, Any]:
    return {"day": ctx.params["scheduled"]["at"][:10]}


FLOWS = [order, ship_line, daily_report]
