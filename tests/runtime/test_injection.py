"""Exact fault injection at every stream call site of a real in-process Worker on real Redis.

Each fault is raised by a wrapper around a real redis client (tests.support.workers.FaultyRedis):
once, or a planned number of times, then the real command runs again. The worker must stay
alive, go through BACKOFF back to READING, log the outage once, and consume everything
exactly once afterwards.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable
from typing import Any

import pytest
import redis

from plaita.fsm import State
from tests.support.workers import READ_CLIENT_NAME, FaultPlan, RunningWorker, running_worker, wait_for

pytestmark = pytest.mark.redis

STREAM = "plaita:test:queue"
GROUP = "plaita-workers"
CONSUMER = "test-host:0"

#: The three exceptions of the seed defect, as factories (a fresh instance per raise).
TRANSIENT_ERRORS = [
    pytest.param(lambda: redis.exceptions.TimeoutError("injected: Timeout reading from socket"), id="redis-Timeout"),
    pytest.param(lambda: redis.exceptions.ConnectionError("injected: Connection reset by peer"), id="redis-Connection"),
    # socket.timeout is the builtin TimeoutError since Python 3.10 (ruff UP041 spells it so).
    pytest.param(lambda: TimeoutError("injected: timed out"), id="socket-timeout"),
]


def add_task(rclient: redis.Redis, n: int, **params: Any) -> str:
    """XADD a valid start task numbered ``n``; returns its id."""
    body = {"type": "start", "flow_id": "f", "params": {"n": n, **params}}
    return str(rclient.xadd(STREAM, {"payload": json.dumps(body), "schema_version": "1"}))


def pending(rclient: redis.Redis) -> int:
    try:
        return int(rclient.xpending(STREAM, GROUP)["pending"])
    except redis.ResponseError:
        return 0  # no group (yet)


def snapshot(rclient: redis.Redis) -> Callable[[], dict[str, Any]]:
    """A BACKOFF-entry hook recording what Redis holds at the moment of the failure."""

    def take() -> dict[str, Any]:
        rows = []
        with contextlib.suppress(redis.ResponseError):
            rows = rclient.xpending_range(STREAM, GROUP, min="-", max="+", count=100)
        return {
            "xlen": int(rclient.xlen(STREAM)),
            "pending": [(r["message_id"], r["consumer"], r["times_delivered"]) for r in rows],
        }

    return take


def records(caplog: pytest.LogCaptureFixture, level: int, text: str) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name.startswith("plaita.runtime") and r.levelno == level and text in r.getMessage()
    ]


def errors(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("plaita") and r.levelno >= logging.ERROR]


def assert_one_transient_outage(caplog: pytest.LogCaptureFixture) -> None:
    """Exactly one warning for the outage, one 'back' line, and no error-level log at all."""
    assert len(records(caplog, logging.WARNING, "Redis unavailable")) == 1, caplog.text
    assert len(records(caplog, logging.INFO, "Redis is back")) == 1, caplog.text
    assert errors(caplog) == [], caplog.text


def finish(rw: RunningWorker, rclient: redis.Redis, expected_ids: list[str]) -> None:
    """Wait for every expected id to be executed and acked+deleted; then check exactly once."""
    rw.recorder.wait_count(len(expected_ids))
    wait_for(lambda: pending(rclient) == 0 and rclient.xlen(STREAM) == 0, 5.0, "all entries acked and deleted")
    assert rw.alive
    assert rw.worker.last_error is None
    assert rw.worker.lifecycle.state in (State.READING, State.RECLAIMING)


@pytest.fixture(autouse=True)
def _log_level(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="plaita")


class TestTransientAtEachCallSite:
    """TimeoutError, ConnectionError and socket.timeout raised once at each call site."""

    @pytest.mark.parametrize("make_exc", TRANSIENT_ERRORS)
    def test_ensure_group(
        self,
        make_exc: Callable[[], BaseException],
        redis_url: str,
        rclient: redis.Redis,
        caplog: pytest.LogCaptureFixture,
    ) -> None:
        """A failing XGROUP CREATE on start backs off, retries, then consumes old and new tasks once."""
        plan = FaultPlan()
        plan.arm("xgroup_create", make_exc())
        id1 = add_task(rclient, 1)
        with running_worker(redis_url, plan=plan, wait_reading=False) as rw:
            rw.worker.wait_reading_after_backoff(1)
            assert plan.raised["xgroup_create"] == 1
            assert plan.calls["xgroup_create"] == 2
            id2 = add_task(rclient, 2)
            finish(rw, rclient, [id1, id2])
        assert rw.recorder.ids() == [id1, id2]
        assert rw.worker.counters.completed == 2
        assert rw.worker.entered(State.BACKOFF) == 1
        assert_one_transient_outage(caplog)

    @pytest.mark.parametrize("make_exc", TRANSIENT_ERRORS)
    def test_read_new(
        self,
        make_exc: Callable[[], BaseException],
        redis_url: str,
        rclient: redis.Redis,
        caplog: pytest.LogCaptureFixture,
    ) -> None:
        """A failing XREADGROUP > (before the server saw it) backs off and consumes everything once."""
        with running_worker(redis_url) as rw:
            id1 = add_task(rclient, 1)
            rw.recorder.wait_count(1)
            rw.plan.arm("xreadgroup_new", make_exc())
            rw.worker.wait_reading_after_backoff(1)
            assert rw.plan.raised["xreadgroup_new"] == 1
            id2 = add_task(rclient, 2)
            finish(rw, rclient, [id1, id2])
        assert rw.recorder.ids() == [id1, id2]
        assert_one_transient_outage(caplog)

    @pytest.mark.parametrize("make_exc", TRANSIENT_ERRORS)
    def test_read_reply_lost(
        self,
        make_exc: Callable[[], BaseException],
        redis_url: str,
        rclient: redis.Redis,
        caplog: pytest.LogCaptureFixture,
    ) -> None:
        """A read whose reply is lost acks nothing: the entry stays pending and is run once later."""
        # Armed before the worker starts: a blocking read already in progress when a test arms
        # the plan would slip past it. Only a reply carrying entries is lost, so arming early is exact.
        plan = FaultPlan()
        plan.arm("xreadgroup_new", make_exc(), after_call=True, only_with_entries=True)
        with running_worker(
            redis_url, plan=plan, on_backoff=snapshot(rclient), claim_min_idle_ms=200, reclaim_interval_s=0.05
        ) as rw:
            id1 = add_task(rclient, 1)
            rw.worker.wait_reading_after_backoff(1)
            id2 = add_task(rclient, 2)
            finish(rw, rclient, [id1, id2])
        # At the failure the server had delivered id1 to us, and nothing was acked.
        assert rw.worker.backoff_snapshots[0] == {"xlen": 1, "pending": [(id1, CONSUMER, 1)]}
        assert sorted(rw.recorder.ids()) == sorted([id1, id2])
        assert_one_transient_outage(caplog)

    @pytest.mark.parametrize("make_exc", TRANSIENT_ERRORS)
    def test_autoclaim(
        self,
        make_exc: Callable[[], BaseException],
        redis_url: str,
        rclient: redis.Redis,
        caplog: pytest.LogCaptureFixture,
    ) -> None:
        """A failing XAUTOCLAIM on the start-up reclaim pass backs off, then claims the idle entry once."""
        rclient.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
        id1 = add_task(rclient, 1)
        assert rclient.xreadgroup(GROUP, "gone-host:0", {STREAM: ">"}, count=1)  # left pending by a dead worker
        plan = FaultPlan()
        plan.arm("reclaim", make_exc())
        with running_worker(
            redis_url, plan=plan, on_backoff=snapshot(rclient), wait_reading=False, claim_min_idle_ms=0
        ) as rw:
            rw.worker.wait_reading_after_backoff(1)
            assert plan.raised["reclaim"] == 1
            id2 = add_task(rclient, 2)
            finish(rw, rclient, [id1, id2])
        assert rw.worker.backoff_snapshots[0] == {"xlen": 1, "pending": [(id1, "gone-host:0", 1)]}
        assert rw.recorder.ids() == [id1, id2]
        assert [e.delivery_count for e in rw.recorder.executions] == [2, 1]
        assert rw.worker.counters.reclaimed == 1
        assert_one_transient_outage(caplog)

    @pytest.mark.parametrize("make_exc", TRANSIENT_ERRORS)
    def test_ack(
        self,
        make_exc: Callable[[], BaseException],
        redis_url: str,
        rclient: redis.Redis,
        caplog: pytest.LogCaptureFixture,
    ) -> None:
        """A failing XACK keeps the finished task, retries the ack after recovery, never re-runs it."""
        with running_worker(redis_url, on_backoff=snapshot(rclient)) as rw:
            rw.plan.arm("xack", make_exc())
            id1 = add_task(rclient, 1)
            rw.worker.wait_reading_after_backoff(1)
            id2 = add_task(rclient, 2)
            finish(rw, rclient, [id1, id2])
        assert rw.plan.raised["xack"] == 1
        # At the failure the task had run but its ack had not reached Redis.
        assert rw.worker.backoff_snapshots[0] == {"xlen": 1, "pending": [(id1, CONSUMER, 1)]}
        assert rw.recorder.ids() == [id1, id2]
        assert rw.worker.counters.completed == 2
        assert_one_transient_outage(caplog)


class TestAckRetry:
    """Finished work whose ack failed is acked later, never executed again."""

    def test_ack_failing_across_two_recoveries_is_not_reclaimed(
        self, redis_url: str, rclient: redis.Redis, caplog: pytest.LogCaptureFixture
    ) -> None:
        """With every pending entry claimable (min idle 0), a task whose ack failed twice still runs once."""
        with running_worker(redis_url, on_backoff=snapshot(rclient), claim_min_idle_ms=0) as rw:
            rw.plan.arm("xack", redis.exceptions.TimeoutError("injected"), times=2)
            id1 = add_task(rclient, 1)
            rw.worker.wait_reading_after_backoff(2)
            id2 = add_task(rclient, 2)
            finish(rw, rclient, [id1, id2])
        assert rw.plan.raised["xack"] == 2
        assert rw.recorder.ids() == [id1, id2]
        assert rw.worker.counters.completed == 2
        # Redis answered XGROUP CREATE in between, so each failed ack is an outage of its own.
        assert len(records(caplog, logging.WARNING, "Redis unavailable during ack")) == 2, caplog.text
        assert len(records(caplog, logging.INFO, "Redis is back")) == 2, caplog.text
        assert errors(caplog) == [], caplog.text

    def test_ack_reply_lost_is_retried_harmlessly(
        self, redis_url: str, rclient: redis.Redis, caplog: pytest.LogCaptureFixture
    ) -> None:
        """An ack that reached Redis but whose reply was lost is retried as a no-op; the task ran once."""
        with running_worker(redis_url) as rw:
            rw.plan.arm("xack", redis.exceptions.ConnectionError("injected"), after_call=True)
            id1 = add_task(rclient, 1)
            rw.worker.wait_reading_after_backoff(1)
            id2 = add_task(rclient, 2)
            finish(rw, rclient, [id1, id2])
        assert rw.recorder.ids() == [id1, id2]
        assert_one_transient_outage(caplog)


class TestPersistentErrors:
    """Operator errors are logged at error on every attempt, retried slowly, and survived."""

    @pytest.mark.parametrize(
        "make_exc",
        [
            pytest.param(lambda: redis.exceptions.AuthenticationError("injected: invalid password"), id="auth"),
            pytest.param(
                lambda: redis.exceptions.ResponseError(
                    "NOPERM User worker has no permissions to run the 'xgroup|create' command"
                ),
                id="noperm",
            ),
        ],
    )
    def test_ensure_group_refused_twice(
        self,
        make_exc: Callable[[], BaseException],
        redis_url: str,
        rclient: redis.Redis,
        caplog: pytest.LogCaptureFixture,
    ) -> None:
        """Two refused XGROUP CREATEs: two error logs, two backoffs, then normal consumption."""
        plan = FaultPlan()
        plan.arm("xgroup_create", make_exc(), times=2)
        id1 = add_task(rclient, 1)
        with running_worker(redis_url, plan=plan, wait_reading=False) as rw:
            rw.worker.wait_reading_after_backoff(2)
            assert plan.raised["xgroup_create"] == 2
            assert rw.worker.lifecycle.last_failure_persistent
            id2 = add_task(rclient, 2)
            finish(rw, rclient, [id1, id2])
        assert rw.recorder.ids() == [id1, id2]
        assert rw.worker.entered(State.BACKOFF) == 2
        refused = records(caplog, logging.ERROR, "Redis refused")
        assert len(refused) == 2, caplog.text
        assert records(caplog, logging.WARNING, "Redis unavailable") == []
        assert len(records(caplog, logging.INFO, "Redis is back")) == 1


class TestGroupLost:
    """The group or the whole stream vanishing under a running worker is recreated."""

    @pytest.mark.parametrize("action", ["destroy_group", "delete_stream"])
    def test_group_recreated(
        self, action: str, redis_url: str, rclient: redis.Redis, caplog: pytest.LogCaptureFixture
    ) -> None:
        """NOGROUP (or UNBLOCKED) under a blocked read: a warning, the group recreated, new tasks run."""
        with running_worker(redis_url, read_block_ms=2000) as rw:
            id1 = add_task(rclient, 1)
            rw.recorder.wait_count(1)
            wait_for(lambda: pending(rclient) == 0, 5.0, "first task acked")

            def reader_blocked() -> bool:
                return any(
                    c.get("name") == READ_CLIENT_NAME and "b" in str(c.get("flags")) for c in rclient.client_list()
                )

            wait_for(reader_blocked, 5.0, "the worker blocked in XREADGROUP")
            if action == "destroy_group":
                assert rclient.xgroup_destroy(STREAM, GROUP)
            else:
                assert rclient.delete(STREAM) == 1
            rw.worker.wait_reading_after_backoff(1)
            id2 = add_task(rclient, 2)
            finish(rw, rclient, [id1, id2])
        assert rw.recorder.ids() == [id1, id2]
        assert len(records(caplog, logging.WARNING, "recreated it")) == 1, caplog.text
        assert_one_transient_outage(caplog)


class TestNoDuplicates:
    """Finished work is never dispatched again while its ack is still on its way to Redis."""

    def test_reclaimed_task_with_slow_ack_is_not_rerun_by_own_pending_scan(
        self, redis_url: str, rclient: redis.Redis
    ) -> None:
        """A task claimed on start and finished before its (slow) ack lands runs exactly once."""
        rclient.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
        id1 = add_task(rclient, 1)
        assert rclient.xreadgroup(GROUP, "gone-host:0", {STREAM: ">"}, count=1)
        plan = FaultPlan()
        plan.slow("xack", 0.3)
        with running_worker(redis_url, plan=plan, wait_reading=False, claim_min_idle_ms=0) as rw:
            rw.recorder.wait_count(1)
            wait_for(lambda: pending(rclient) == 0 and rclient.xlen(STREAM) == 0, 5.0, "the task acked")
            plan.slow("xack", 0.0)
            id2 = add_task(rclient, 2)
            finish(rw, rclient, [id1, id2])
        assert [(e.message_id, e.delivery_count) for e in rw.recorder.executions] == [(id1, 2), (id2, 1)]
        assert rw.worker.counters.completed == 2
