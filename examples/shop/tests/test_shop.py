"""The order pipeline tested with plaita.testing: a real worker and keeper on a private server,
the clock moved ahead instead of waited for (a day's timeout, a 3-day sleep, a 30 s backoff).

Run: ``pytest -p plaita.testing examples/shop/tests`` (no system Redis needed)."""

from __future__ import annotations

import time

import pytest

from examples.shop import flows as shop
from plaita import NonRetryableError
from plaita.flows import Child, Spawn, Suspend
from plaita.testing import FlowTestRunner, run_step

LINES = [{"sku": "mug", "qty": 2, "price_cents": 900}, {"sku": "tea", "qty": 1, "price_cents": 500}]


def start_paid_order(flow_runner: FlowTestRunner, order_id: str, **params: object) -> str:
    flow_runner.load(shop)
    eid = flow_runner.start(shop.order, {"order_id": order_id, "lines": LINES, **params})
    flow_runner.wait_until_waiting(eid, "payment")
    flow_runner.resume(eid, {"amount_cents": 2300}, wait_for="payment", resume_id=f"pay-{order_id}")
    return eid


def test_an_order_is_paid_shipped_and_reminded_three_days_later(flow_runner: FlowTestRunner) -> None:
    started = time.monotonic()
    eid = start_paid_order(flow_runner, "o-1")
    doc = flow_runner.run_until_done(eid)  # jumps the clock over the 3-day sleep
    assert doc["status"] == "completed", doc
    assert doc["state"]["tracking"] == ["TRK-o-1-mug", "TRK-o-1-tea"]
    assert doc["state"]["reminded"] is True
    assert (
        flow_runner.clock.offset_s >= shop.REVIEW_DELAY_S - 60
    )  # three days passed on the clock (less the real seconds since the sleep began)...
    assert time.monotonic() - started < 15  # ...in seconds of real time


def test_an_unpaid_order_times_out_after_a_day(flow_runner: FlowTestRunner) -> None:
    flow_runner.load(shop)
    doc = flow_runner.run(shop.order, {"order_id": "o-2", "lines": LINES})
    assert doc["status"] == "error"
    assert "not paid within a day" in doc["error"]["message"]


def test_an_order_with_an_hour_to_go_is_cancelled_at_its_deadline(flow_runner: FlowTestRunner) -> None:
    flow_runner.load(shop)
    doc = flow_runner.run(shop.order, {"order_id": "o-6", "lines": LINES}, deadline_s=3600)
    assert doc["status"] == "cancelled" and doc["error"]["type"] == "DeadlineExceeded"
    assert 3500 < flow_runner.clock.offset_s < shop.PAYMENT_TIMEOUT_S  # the deadline came first


def test_a_wrong_amount_fails_the_order(flow_runner: FlowTestRunner) -> None:
    flow_runner.load(shop)
    eid = flow_runner.start(shop.order, {"order_id": "o-3", "lines": LINES})
    flow_runner.wait_until_waiting(eid, "payment")
    flow_runner.resume(eid, {"amount_cents": 1}, wait_for="payment")
    doc = flow_runner.run_until_done(eid)
    assert doc["status"] == "error" and "paid 1 cents" in doc["error"]["message"]


def test_a_carrier_failure_is_retried_after_its_backoff(flow_runner: FlowTestRunner) -> None:
    flow_runner.load(shop)
    doc = flow_runner.run(shop.ship_line, {"order_id": "o-4", "sku": "mug", "carrier_fails": 2})
    assert doc["status"] == "completed" and doc["state"]["tracking"] == "TRK-o-4-mug"
    failed = [h for h in doc["history"] if h["outcome"] == "failed"]
    assert len(failed) == 2
    assert flow_runner.clock.offset_s >= shop.CARRIER_RETRY_BASE_S  # the backoff passed on the clock


def test_a_cancelled_order_ends_while_it_waits(flow_runner: FlowTestRunner) -> None:
    flow_runner.load(shop)
    eid = flow_runner.start(shop.order, {"order_id": "o-5", "lines": LINES})
    flow_runner.wait_until_waiting(eid, "payment")
    flow_runner.cancel(eid)
    assert flow_runner.run_until_done(eid, advance=False)["status"] == "cancelled"


def test_the_daily_report_runs_at_its_tick(flow_runner: FlowTestRunner) -> None:
    eid = flow_runner.tick(shop.daily_report)
    doc = flow_runner.run_until_done(eid)
    assert doc["status"] == "completed" and len(doc["state"]["day"]) == 10


# -- single steps, no server ---------------------------------------------------------------
def test_reserve_totals_the_order_and_stages_the_units() -> None:
    done = run_step(shop.order, "reserve", params={"lines": LINES})
    assert done.value == {"total_cents": 2300}
    assert done.staged == [("incrby", shop.RESERVED_KEY, "3")]


def test_await_payment_suspends_for_the_payment() -> None:
    done = run_step(shop.order, "await_payment", state={"total_cents": 2300})
    assert isinstance(done.value, Suspend) and done.value.wait_for == "payment"


def test_ship_lines_fans_out_then_joins_the_children() -> None:
    first = run_step(shop.order, "ship_lines", params={"order_id": "o", "lines": LINES})
    assert isinstance(first.value, Spawn) and len(first.value.params) == 2
    children = [Child("c0", "completed", {"tracking": "T0"}), Child("c1", "completed", {"tracking": "T1"})]
    joined = run_step(shop.order, "ship_lines", params={"lines": LINES}, children=children)
    assert joined.value == {"tracking": ["T0", "T1"]}


def test_ship_lines_fails_when_a_line_did_not_ship() -> None:
    children = [Child("c0", "completed", {"tracking": "T0"}), Child("c1", "error", error={"type": "CarrierDown"})]
    with pytest.raises(NonRetryableError, match="c1"):
        run_step(shop.order, "ship_lines", params={"lines": LINES}, children=children)
