"""The order pipeline tested with plaita.testing: a real flow worker, keeper and named-task worker
on a private server, the clock moved ahead instead of waited for (a day's payment timeout, the
nightly tick).

Run: ``pytest -p plaita.testing examples/orders/tests`` (no system Redis needed)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from examples.orders import flows as orders
from examples.orders import tasks as mail
from plaita.testing import FlowTestRunner

LINES = [{"sku": "mug", "qty": 2, "price_cents": 900}, {"sku": "tea", "qty": 1, "price_cents": 500}]
TOTAL_CENTS = 2300


@pytest.fixture
def shop(flow_runner: FlowTestRunner, monkeypatch: pytest.MonkeyPatch) -> Iterator[FlowTestRunner]:
    """The flows and the email tasks loaded; the steps' task client pointed at the runner's queue."""
    monkeypatch.setenv("PLAITA_REDIS_URL", flow_runner.redis_url)
    monkeypatch.setenv("ORDERS_TASKS_QUEUE", flow_runner.tasks_queue)
    mail.OUTBOX.clear()
    flow_runner.load(orders)
    flow_runner.load_tasks(mail.tasks)
    yield flow_runner


def order(
    shop: FlowTestRunner, order_id: str, customer_id: str, lines: list[dict[str, object]] = LINES, **extra: object
) -> str:
    params = {"order_id": order_id, "customer_id": customer_id, "email": f"{customer_id}@example.com", "lines": lines}
    return shop.start(orders.order, {**params, **extra})


def test_a_paid_order_is_reserved_line_by_line_and_confirmed_by_email(shop: FlowTestRunner) -> None:
    eid = order(shop, "o-1", "ann")
    shop.wait_until_waiting(eid, "payment")  # the fan-out joined: now it waits for the message
    shop.send(eid, "payment", {"amount_cents": TOTAL_CENTS}, idempotency_key="webhook-1")
    doc = shop.run_until_done(eid)
    assert doc["status"] == "completed", doc
    assert doc["state"]["total_cents"] == TOTAL_CENTS and doc["state"]["paid_cents"] == TOTAL_CENTS
    sent = shop.task_client.result(f"confirm-{eid}", timeout_s=20)
    assert sent == {"sent_to": "ann@example.com", "first": True}
    assert mail.OUTBOX[f"confirm-{eid}"]["subject"] == "order o-1 confirmed"


def test_a_payment_sent_before_the_order_waits_for_it_is_kept(shop: FlowTestRunner) -> None:
    hold = orders.HOLDS.setdefault("bo-2", threading.Event())
    try:
        eid = order(shop, "o-2", "bo", hold="bo-2")
        shop.wait_for_status(eid, "running")  # still reserving: no recv has run yet
        shop.send(eid, "payment", {"amount_cents": TOTAL_CENTS})  # the webhook beat the fan-out
    finally:
        hold.set()
        orders.HOLDS.pop("bo-2", None)
    doc = shop.run_until_done(eid)
    assert doc["status"] == "completed", doc
    taken = [h["resume_id"] for h in doc["history"] if h.get("outcome") == "resumed"]
    assert len(taken) == 1 and taken[0].startswith("msg:payment:"), doc["history"]  # the kept message


def test_an_unpaid_order_times_out_after_a_day(shop: FlowTestRunner) -> None:
    doc = shop.run(orders.order, {"order_id": "o-3", "customer_id": "cy", "email": "cy@example.com", "lines": LINES})
    assert doc["status"] == "error" and "not paid within a day" in doc["error"]["message"]
    assert shop.clock.offset_s >= orders.PAYMENT_TIMEOUT_S - 60  # the day passed on the clock
    assert not mail.OUTBOX


def test_a_line_out_of_stock_fails_the_order_before_any_payment(shop: FlowTestRunner) -> None:
    eid = order(shop, "o-4", "di", [{"sku": "out-of-stock", "qty": 1}])
    doc = shop.run_until_done(eid, advance=False)
    assert doc["status"] == "error" and "lines not reserved" in doc["error"]["message"]


def test_a_customer_has_one_order_running_at_a_time_and_others_are_not_held_up(shop: FlowTestRunner) -> None:
    """While eve's first order runs (held in its first step), her second one waits for her slot
    and fay's order runs past it; freed, eve's second one runs."""
    hold = orders.HOLDS.setdefault("eve-1", threading.Event())
    try:
        first = order(shop, "o-5", "eve", hold="eve-1")
        shop.wait_for_status(first, "running")
        second, other = order(shop, "o-6", "eve"), order(shop, "o-7", "fay")
        shop.wait_until_waiting(other, "payment")  # another customer's order ran meanwhile
        assert (shop.get(second) or {}).get("status") == "queued"  # parked behind eve's running order
        hold.set()
        for eid in (first, second, other):
            shop.wait_until_waiting(eid, "payment")
            shop.send(eid, "payment", {"amount_cents": TOTAL_CENTS})
            assert shop.run_until_done(eid)["status"] == "completed"
    finally:
        hold.set()
        orders.HOLDS.pop("eve-1", None)


def test_the_nightly_summary_runs_on_its_tick_and_emails_ops(shop: FlowTestRunner) -> None:
    eid = shop.tick(orders.orders_nightly)
    doc = shop.run_until_done(eid)
    assert doc["status"] == "completed", doc
    day = doc["state"]["day"]
    assert shop.task_client.result(f"nightly-{day}", timeout_s=20)["sent_to"] == "ops@example.com"
