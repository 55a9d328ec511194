"""Delayed flow starts with the test clock: a start three days ahead is recorded queued at once,
does not run early, and runs (in well under a minute) once the clock reaches it; a cancelled one
ends cancelled when due without running a step; a dedup key holds a delayed start."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from plaita.flows import Flow, StepContext
from plaita.store.streams.delayed import delayed_count
from plaita.testing import FlowTestRunner, TestClock
from tests.support.ops import holds_for

pytestmark = pytest.mark.redis

DAYS_3_S = 3 * 86400

later = Flow("delayed_later")


@later.step
def run(ctx: StepContext) -> Any:
    return {"ran": True, "params": ctx.params}


@pytest.fixture
def runner(redis_url: str) -> Iterator[FlowTestRunner]:
    with TestClock() as clock, FlowTestRunner(redis_url, clock) as flow_runner:
        yield flow_runner


def _delayed(runner: FlowTestRunner) -> int:
    q = runner.flow_client.queue
    return delayed_count(q.client, q.streams)


def test_a_start_three_days_ahead_is_queued_at_once_and_runs_when_due(runner: FlowTestRunner) -> None:
    before_s = runner.clock()
    eid = runner.start(later, {"x": 1}, delay_s=DAYS_3_S)
    doc = runner.get(eid)
    assert doc is not None and doc["status"] == "queued"
    assert doc["waiting"]["for"] == "due"
    assert before_s + DAYS_3_S <= doc["waiting"]["until"] <= runner.clock() + DAYS_3_S + 0.01
    assert _delayed(runner) == 1
    q = runner.flow_client.queue
    assert q.client.ttl(q.keyspace.execution_key(eid)) > DAYS_3_S + 6 * 86400  # outlives its wait
    # The worker's reclaim pass (every 0.25 s here) runs several times: it must not move it early.
    holds_for(lambda: runner.get(eid)["status"] == "queued" and _delayed(runner) == 1, 1.0, "not due yet")  # type: ignore[index]
    started = time.monotonic()
    done = runner.run_until_done(eid)  # the runner moves the clock to its due time
    assert done["status"] == "completed" and done["state"] == {"ran": True, "params": {"x": 1}}
    assert runner.clock.offset_s >= DAYS_3_S - 10  # it ran because the clock moved, not early
    assert time.monotonic() - started < 20
    assert _delayed(runner) == 0


def test_a_cancelled_delayed_start_ends_cancelled_at_once_without_a_step(runner: FlowTestRunner) -> None:
    eid = runner.start(later, delay_s=DAYS_3_S)
    keep = runner.start(later, {"kept": True}, delay_s=DAYS_3_S)
    outcome = runner.cancel(eid)
    assert outcome.outcome == "queued"
    q = runner.flow_client.queue
    assert q.client.ttl(q.keyspace.cancel_key(eid)) > DAYS_3_S + 6 * 86400  # outlives the wait
    done = runner.run_until_done(eid, advance=False)  # the clock does not move: it ends now
    assert done["status"] == "cancelled" and runner.clock.offset_s == 0
    assert done.get("steps_run", 0) == 0 and "ran" not in (done.get("state") or {})
    assert (runner.get(keep) or {}).get("status") == "queued" and _delayed(runner) == 1  # only its own moved
    assert runner.cancel(eid).outcome == "already_cancelled"


def test_at_sets_the_due_time_and_a_dedup_key_holds_a_delayed_start(runner: FlowTestRunner) -> None:
    at_s = runner.clock() + 3600
    eid = runner.start(later, at=at_s, dedup_key="once")
    again = runner.start(later, delay_s=10, dedup_key="once")
    assert again == eid and _delayed(runner) == 1
    doc = runner.get(eid)
    assert doc is not None and doc["waiting"]["until"] == pytest.approx(at_s, abs=0.001)
    assert runner.run_until_done(eid)["status"] == "completed"


def test_a_bad_delay_is_refused_before_anything_is_written(runner: FlowTestRunner) -> None:
    runner.load(later)
    with pytest.raises(ValueError, match="not both"):
        runner.flow_client.start("delayed_later", delay_s=5, at=runner.clock() + 5)
    with pytest.raises(ValueError, match="delay_s"):
        runner.flow_client.start("delayed_later", delay_s=-1)
    assert _delayed(runner) == 0
