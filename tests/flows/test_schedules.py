"""Schedules: cron ticks in a time zone, the missed-ticks policies after a downtime, exactly one
start per tick with several keepers racing (no keeper lease), a keeper that died between claim
and enqueue, and bad definitions refused at load."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator

import pytest
import redis

from plaita.config import Settings
from plaita.errors import ConfigError
from plaita.flows import Flow, Schedule
from plaita.flows.keeper.keeper import KeeperSettings
from plaita.flows.model.schedules import execution_id_of
from plaita.ops.keeper_build import build_keeper, build_scheduler
from plaita.store.client import make_client
from plaita.store.executions.schedule_store import ScheduleStore, schedule_key
from plaita.store.executions.store import ExecutionStore
from plaita.store.streams.partitioned import open_queue
from plaita.store.streams.queue import StreamQueue
from tests.flows.test_schedule_ticks import T0
from tests.support.lease_workers import QUEUE


def flow(flow_id: str = "sync", **schedule: object) -> Flow:
    f = Flow(flow_id, schedule=Schedule(**{"cron": "*/5 * * * *", **schedule}))  # type: ignore[arg-type]
    f.step(lambda ctx: None, name="run")
    return f


class Env:
    """One keeper's view: its own client, queue and scheduler over the test stream."""

    def __init__(self, url: str, flows: list[Flow], **options: float) -> None:
        self.client = make_client(url, socket_timeout_s=5.0)
        self.queue = StreamQueue(
            self.client, stream=QUEUE, group="plaita-workers", consumer="k", dlq_key="d", dlq_max_len=10
        )
        self.scheduler = build_scheduler(flows, self.queue, **options)  # type: ignore[arg-type]

    def starts(self) -> list[dict[str, object]]:
        return [json.loads(f[b"payload"]) for _, f in self.client.xrange(QUEUE)]  # type: ignore[union-attr]

    def started_ids(self) -> list[str]:
        return [str(b["execution_id"]) for b in self.starts()]


@pytest.fixture
def env(redis_url: str) -> Iterator[Env]:
    e = Env(redis_url, [flow()])
    yield e
    e.client.close()


# -- definitions -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"cron": "61 * * * *"}, "not a cron expression"),
        ({"cron": "every 5 minutes"}, "not a cron expression"),
        ({"cron": "* * * * *", "tz": "Mars/Olympus"}, "unknown time zone"),
        ({"cron": "* * * * *", "missed": "some"}, "missed must be one of"),
        ({"cron": "* * * * *", "max_catchup": 0}, "max_catchup"),
        ({"cron": "* * * * *", "params": {"scheduled": 1}}, "without the key 'scheduled'"),
        ({"cron": "* * * * *", "params": {"x": float("nan")}}, "not strict JSON"),
    ],
)
def test_a_bad_schedule_is_a_config_error_at_definition(options: dict[str, object], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        Flow("f", schedule=Schedule(**options))  # type: ignore[arg-type]


# -- the pass ----------------------------------------------------------------------------


def test_a_new_schedule_starts_at_its_next_tick_with_a_derived_id_and_dedup_key(env: Env) -> None:
    assert env.scheduler.run_pass(T0 - 120).started == []  # first seen between ticks: nothing due
    started = env.scheduler.run_pass(T0 + 3).started
    assert started == [execution_id_of("sync", T0)] == [f"schedule:sync:{T0}"]
    [body] = env.starts()
    assert body["execution_id"] == body["dedup_key"] == f"schedule:sync:{T0}"
    assert body["params"] == {"scheduled": {"tick_s": T0, "at": "2026-12-01T12:00:00+00:00", "missed": 0}}
    assert env.scheduler.run_pass(T0 + 4).started == []  # the same tick never twice
    record = ScheduleStore(env.client).read("sync")
    assert record["last_tick_s"] == str(T0) and record["last_execution_id"] == f"schedule:sync:{T0}"
    assert "pending" not in record and record["cron"] == "*/5 * * * *"


@pytest.mark.parametrize(
    ("missed", "expected"),
    [
        ("skip", []),  # every tick of the downtime dropped
        ("once", [T0 + 3600]),  # one run, at the newest due tick
        ("all", [T0 + 3600 - 300 * i for i in (3, 2, 1, 0)]),  # each, oldest first, the newest max_catchup
    ],
)
def test_missed_ticks_after_a_downtime_follow_the_policy(redis_url: str, missed: str, expected: list[int]) -> None:
    e = Env(redis_url, [flow(missed=missed, max_catchup=4)])
    try:
        assert e.scheduler.run_pass(T0 + 1).started == [execution_id_of("sync", T0)]
        # Down from 12:00 to 13:02: the ticks 12:05 .. 13:00 were missed (all older than grace_s).
        report = e.scheduler.run_pass(T0 + 3600 + 120)
        assert report.started == [execution_id_of("sync", t) for t in expected]
        assert report.dropped == 12 - len(expected)
        if missed == "once":
            assert e.starts()[-1]["params"]["scheduled"]["missed"] == 11  # type: ignore[index]
        # The bookkeeping moved past the downtime: the next tick is on time, and runs alone.
        assert e.scheduler.run_pass(T0 + 3900 + 2).started == [execution_id_of("sync", T0 + 3900)]
        assert len(e.started_ids()) == len(set(e.started_ids())) == 1 + len(expected) + 1
    finally:
        e.client.close()


def test_a_downtime_right_after_a_schedule_was_first_seen_counts_as_missed(redis_url: str) -> None:
    e = Env(redis_url, [flow(missed="once")])
    try:
        assert e.scheduler.run_pass(T0 - 100).started == []  # seen, nothing due yet
        assert e.scheduler.run_pass(T0 + 3720).started == [execution_id_of("sync", T0 + 3600)]
        assert e.starts()[0]["params"]["scheduled"]["missed"] == 12  # type: ignore[index]
    finally:
        e.client.close()


def test_with_partitions_each_tick_goes_to_its_own_partition_with_its_dedup_key(redis_url: str) -> None:
    settings = Settings(redis_url=redis_url, queue_name=QUEUE, partitions=3)
    client = make_client(redis_url, socket_timeout_s=5.0)
    queue = open_queue(settings, client=client)
    scheduler = build_scheduler([flow("fast", cron="* * * * * *", grace_s=1.0)], queue)
    try:
        started = sum((scheduler.run_pass(now_s + 0.5).started for now_s in range(T0, T0 + 12)), [])
        assert started == [execution_id_of("fast", t) for t in range(T0, T0 + 12)]
        ks = queue.keyspace
        assert len({ks.partition_of(eid) for eid in started}) == 3
        for eid in started:
            stream = [json.loads(f[b"payload"]) for _, f in client.xrange(ks.stream(ks.partition_of(eid)))]
            assert [b for b in stream if b["execution_id"] == eid][0]["dedup_key"] == eid
    finally:
        client.close()


def test_a_tick_late_by_less_than_the_grace_is_on_time_even_with_skip(env: Env) -> None:
    env.scheduler.run_pass(T0 - 1)
    assert env.scheduler.run_pass(T0 + 59).started == [execution_id_of("sync", T0)]


def test_three_keepers_racing_start_each_tick_exactly_once(redis_url: str) -> None:
    """No keeper lease: three schedulers, each its own connection, pass over the same 60 ticks
    of a seconds schedule at once (barriers line them up per tick, and between reading the
    schedule and claiming its ticks)."""
    f = flow("fast", cron="* * * * * *", grace_s=1.0)
    keepers = [Env(redis_url, [f]) for _ in range(3)]
    barrier = threading.Barrier(3, timeout=10)
    read_barrier = threading.Barrier(3, timeout=10)
    for k in keepers:
        # Each keeper reads the schedule before any claims it: all three then claim the same ticks.
        def read(flow_id: str, read: Callable[[str], dict[str, str]] = k.scheduler.store.read) -> dict[str, str]:
            record = read(flow_id)
            read_barrier.wait()
            return record

        k.scheduler.store.read = read  # type: ignore[method-assign]
    started: list[list[str]] = [[] for _ in keepers]
    errors: list[BaseException] = []

    def keep(i: int) -> None:
        try:
            for now_s in range(T0, T0 + 60):
                barrier.wait()
                started[i] += keepers[i].scheduler.run_pass(now_s + 0.5).started
        except BaseException as exc:  # reported below, with the thread's own error
            errors.append(exc)
            barrier.abort()
            read_barrier.abort()

    threads = [threading.Thread(target=keep, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    try:
        assert not errors, errors
        in_stream = keepers[0].started_ids()
        # On first sight the ticks within grace_s are on time: only T0 here.
        assert sorted(in_stream) == sorted(execution_id_of("fast", t) for t in range(T0, T0 + 60))
        assert len(in_stream) == 60, "a tick was enqueued twice"
        assert sorted(sum(started, [])) == sorted(in_stream)
        assert all(started), "one keeper did everything: the race did not happen"
    finally:
        for k in keepers:
            k.client.close()


def test_a_keeper_that_read_the_schedule_before_another_started_the_tick_starts_nothing(redis_url: str) -> None:
    """A keeper paused between reading the schedule and claiming (a GC pause, a slow network)
    while another keeper ran a whole pass: its claim compares and fails."""
    slow, fast = Env(redis_url, [flow()]), Env(redis_url, [flow()])
    try:
        slow.scheduler.run_pass(T0 - 1)
        read = slow.scheduler.store.read

        def paused_read(flow_id: str) -> dict[str, str]:
            record = read(flow_id)
            assert fast.scheduler.run_pass(T0 + 1).started == [execution_id_of("sync", T0)]
            return record

        slow.scheduler.store.read = paused_read  # type: ignore[method-assign]
        assert slow.scheduler.run_pass(T0 + 1).started == []
        assert slow.started_ids() == [execution_id_of("sync", T0)]
    finally:
        slow.client.close()
        fast.client.close()


def test_ticks_claimed_by_a_keeper_that_died_before_enqueueing_are_started_by_the_next(env: Env) -> None:
    store = ScheduleStore(env.client)
    env.scheduler.run_pass(T0 - 1)
    # A keeper claimed T0 and died before enqueueing its start.
    seen = store.read("sync")["last_tick_s"]
    assert seen == str(T0 - 61)  # first seen at T0 - 1: ticks after T0 - 61 count
    assert store.claim("sync", seen, T0, json.dumps({"ticks": [T0], "missed": 0}), repr(T0 + 1.0))
    assert env.scheduler.run_pass(T0 + 2).started == []  # it may still be enqueueing
    assert env.started_ids() == []
    assert env.scheduler.run_pass(T0 + 12).started == [execution_id_of("sync", T0)]
    assert env.scheduler.run_pass(T0 + 300 + 1).started == [execution_id_of("sync", T0 + 300)]
    assert env.started_ids() == [execution_id_of("sync", T0), execution_id_of("sync", T0 + 300)]


def test_an_enqueue_that_fails_after_the_claim_is_sent_again_not_lost(env: Env) -> None:
    env.scheduler.run_pass(T0 - 1)
    start = env.scheduler.producer.start
    calls = []

    def failing_once(*args: object, **kw: object) -> str:
        calls.append(args)
        if len(calls) == 1:
            raise redis.ConnectionError("Redis went away")
        return start(*args, **kw)  # type: ignore[arg-type]

    env.scheduler.producer.start = failing_once  # type: ignore[method-assign]
    with pytest.raises(redis.ConnectionError):  # the keeper's loop backs off and passes again
        env.scheduler.run_pass(T0 + 1)
    assert env.started_ids() == [] and "pending" in ScheduleStore(env.client).read("sync")
    assert env.scheduler.run_pass(T0 + 5).started == []  # not yet stale
    assert env.scheduler.run_pass(T0 + 12).started == [execution_id_of("sync", T0)]
    assert env.started_ids() == [execution_id_of("sync", T0)]
    assert "pending" not in ScheduleStore(env.client).read("sync")


def test_a_late_confirm_of_a_recovered_claim_leaves_the_newer_claim_pending(env: Env) -> None:
    """Keeper A claims and stalls; B enqueues A's ticks again, confirms, claims newer ones; A's
    late confirm must not drop B's claim (B may die before enqueueing it)."""
    store = ScheduleStore(env.client)
    first, second = json.dumps({"ticks": [T0], "missed": 0}), json.dumps({"ticks": [T0 + 300], "missed": 0})
    assert store.claim("sync", "", T0, first, "1.0")
    assert store.confirm("sync", first, "1.0", execution_id_of("sync", T0), T0)  # B's recovery
    assert store.claim("sync", str(T0), T0 + 300, second, "2.0")
    assert not store.confirm("sync", first, "1.0", execution_id_of("sync", T0), T0)  # A, late
    assert store.read("sync")["pending"] == second


def test_a_schedule_key_of_another_type_is_skipped_and_left(env: Env) -> None:
    env.client.set(schedule_key("sync"), "not a hash")
    report = env.scheduler.run_pass(T0 + 1)
    assert report.started == [] and report.corrupt == [schedule_key("sync")]
    assert env.client.get(schedule_key("sync")) == b"not a hash"


def test_the_keeper_runs_the_schedule_pass_and_a_dry_run_starts_nothing(env: Env) -> None:
    store = ExecutionStore(env.client)
    settings = KeeperSettings(interval_s=0.1, lease_ttl_s=2.0)
    dry = build_keeper(
        store,
        env.queue,
        KeeperSettings(interval_s=0.1, lease_ttl_s=2.0, dry_run=True),
        clock=lambda: T0 + 1.0,
        scheduler=env.scheduler,
    )
    assert dry.run_once().scheduled == [execution_id_of("sync", T0)]
    assert env.started_ids() == [] and ScheduleStore(env.client).read("sync") == {}  # read only
    keeper = build_keeper(store, env.queue, settings, clock=lambda: T0 + 1.0, scheduler=env.scheduler)
    assert keeper.run_once().scheduled == [execution_id_of("sync", T0)]
    assert env.started_ids() == [execution_id_of("sync", T0)]
