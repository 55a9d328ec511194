"""Delayed flow starts with the test clock: a start three days ahead is recorded queued at once,
does not run early, and runs (in well under a minute) once the clock reaches it; a cancelled one
ends cancelled when due without running a step; a dedup key holds a delayed start."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from plaita.flows import Flow, FlowClient, StepContext
from plaita.store.acl import PRODUCER_ACL_RULES, setuser_command
from plaita.store.streams.delayed import delayed_count, delayed_key
from plaita.testing import FlowTestRunner, TestClock
from tests.support.ops import holds_for
from tests.support.redis_server import RedisServer

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


def test_a_producer_that_may_not_read_the_set_still_cancels_it_lands_when_due(
    redis_server: RedisServer, redis_url: str
) -> None:
    """A producer user from an older ACL line (no ZRANGEBYSCORE): the cancel is recorded and its
    flag outlives the wait; only the early move is skipped."""
    rules = PRODUCER_ACL_RULES.replace(" +zrangebyscore", "")
    assert rules != PRODUCER_ACL_RULES
    admin = redis.Redis.from_url(redis_url, socket_timeout=5)
    admin.execute_command(*setuser_command("plaita-old-producer", "old-pw-0123456789", rules))
    url = f"redis://plaita-old-producer:old-pw-0123456789@127.0.0.1:{redis_server.port}/0"
    try:
        with FlowClient.from_url(url, queue_name="plaita:test:acl-delay", socket_timeout_s=5.0) as flows:
            eid = flows.start("f", delay_s=DAYS_3_S)
            assert flows.cancel(eid).outcome == "queued"
            assert admin.ttl(flows.queue.keyspace.cancel_key(eid)) > DAYS_3_S + 6 * 86400
            (score,) = [s for _, s in admin.zrange(delayed_key("plaita:test:acl-delay"), 0, -1, withscores=True)]
            assert score > 0  # not made due now: it ends cancelled when due
    finally:
        admin.execute_command("ACL", "DELUSER", "plaita-old-producer")
        admin.close()
