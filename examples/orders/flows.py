"""An order pipeline with what users bring from Celery, arq, BullMQ and DBOS: a payment message,
a fan-out, one order per customer at a time, a nightly schedule and plain email tasks.

Run it with one command from a clone's root (an embedded server, a flow worker with a keeper, a
named-task worker and the dashboard)::

    plaita dev --flows examples.orders.flows --tasks examples.orders.tasks
    plaita executions start order --input '{"order_id": "o-1", "customer_id": "c-7",
        "email": "ann@example.com", "lines": [{"sku": "mug", "qty": 2, "price_cents": 900}]}'
    plaita executions send ID payment --data '{"amount_cents": 1800}' --idempotency-key webhook-1

What it shows, each with the API that does it (docs/flows.md, docs/tasks.md):

- ``order`` has ``max_concurrent_per_key=1`` on ``customer_id``: a customer's second order waits
  until the first one ends, fleet-wide, while other customers' orders run (``plaita limits set
  order --per-key 2`` raises it at run time);
- ``reserve`` fans out one ``reserve_line`` child per line and joins them (``ctx.spawn``);
- ``await_payment`` takes the payment webhook's message (``ctx.recv("payment")``, sent with
  ``FlowClient.send`` or ``plaita executions send``; a message sent early is kept), a day at most;
- ``confirm`` enqueues the confirmation email, a named plain task (``TaskClient.enqueue``) with the
  execution's own task id, so a rerun of the step enqueues the same email, which ``send_email``
  sends once;
- ``orders_nightly`` starts by itself at 02:00 UTC (a ``Schedule``) and enqueues a summary email.

The step finds the task queue from the environment (``PLAITA_REDIS_URL``, set by ``plaita dev``,
and ``ORDERS_TASKS_QUEUE``, default ``plaita dev``'s task queue). examples/orders/tests/ tests it
all with ``plaita.testing``.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from plaita import Flow, NonRetryableError, Schedule, StepContext
from plaita.tasking.client import TaskClient

#: How long an order waits for its payment message.
PAYMENT_TIMEOUT_S = 24 * 3600
#: ``plaita dev``'s queue of plain tasks (``plaita.cli.dev.TASKS_QUEUE``).
DEV_TASKS_QUEUE = "plaita:dev:tasks"

#: A test's way to keep a step running: ``{"hold": NAME}`` in the params makes ``reserve``'s first
#: run wait (30 s at most) until ``HOLDS[NAME]`` is set.
HOLDS: dict[str, threading.Event] = {}

order = Flow("order", max_concurrent_per_key=1, concurrency_key="customer_id")
reserve_line = Flow("reserve_line")
orders_nightly = Flow("orders_nightly", schedule=Schedule("0 2 * * *"))


def tasks_client() -> TaskClient:
    """A client of the named-task queue the ``--tasks`` worker reads."""
    url = os.environ.get("PLAITA_REDIS_URL", "redis://localhost:6379/0")
    return TaskClient.from_url(url, queue_name=os.environ.get("ORDERS_TASKS_QUEUE", DEV_TASKS_QUEUE))


@order.step
def reserve(ctx: StepContext) -> Any:
    lines = ctx.params.get("lines") or []
    if ctx.children is None:  # first run: one child per line, then wait for all of them
        if ctx.params.get("hold") in HOLDS:
            HOLDS[ctx.params["hold"]].wait(30)
        if not lines or any(int(line.get("qty", 0)) < 1 for line in lines):
            raise NonRetryableError("an order needs at least one line, each with a quantity of 1 or more")
        return ctx.spawn("reserve_line", [{"order_id": ctx.params["order_id"], **line} for line in lines])
    short = [c.execution_id for c in ctx.children if not c.ok]
    if short:
        raise NonRetryableError(f"lines not reserved: {short}")
    return {"total_cents": sum(int(c.result["cents"]) for c in ctx.children)}


@reserve_line.step
def hold_stock(ctx: StepContext) -> dict[str, Any]:
    if ctx.params.get("sku") == "out-of-stock":  # a test's way to make a line fail
        raise NonRetryableError(f"{ctx.params['sku']}: none left")
    return {"cents": int(ctx.params["qty"]) * int(ctx.params.get("price_cents", 0))}


@order.step
def await_payment(ctx: StepContext) -> dict[str, Any]:
    payment = ctx.recv("payment", timeout_s=PAYMENT_TIMEOUT_S)  # the same step runs again with it
    if payment is None:
        raise NonRetryableError("not paid within a day: the reservation is released")
    paid = payment.get("amount_cents")
    if paid != ctx.state["total_cents"]:
        raise NonRetryableError(f"paid {paid} cents for an order of {ctx.state['total_cents']}")
    return {"paid_cents": paid}


@order.step
def confirm(ctx: StepContext) -> dict[str, Any]:
    message_id = f"confirm-{ctx.execution_id}"  # the same on a rerun: send_email sends it once
    with tasks_client() as tasks:
        tasks.enqueue(
            "send_email",
            kwargs={
                "to": ctx.params["email"],
                "subject": f"order {ctx.params['order_id']} confirmed",
                "message_id": message_id,
            },
            task_id=message_id,
        )
    return {"confirmation": message_id}


@orders_nightly.step
def summary(ctx: StepContext) -> dict[str, Any]:
    day = ctx.params["scheduled"]["at"][:10]
    with tasks_client() as tasks:
        message = {"to": "ops@example.com", "subject": f"orders of {day}", "message_id": f"nightly-{day}"}
        tasks.enqueue("send_email", kwargs=message, task_id=f"nightly-{day}")
    return {"day": day}


FLOWS = [order, reserve_line, orders_nightly]
