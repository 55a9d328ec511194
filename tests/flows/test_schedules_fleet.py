"""Schedules are a fleet fact (issue 29, item 3), in process on a private redis-server: keeper
leases per queue (the default queue's key unchanged), schedules recorded per queue by whoever
loads them and started by the queue's acting keeper whatever flows it loaded, recorded again one
pass after a data loss, a record not refreshed for its TTL forgotten, a bad record skipped."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator

import pytest
import redis

from plaita.config import Settings
from plaita.flows import Flow, Schedule
from plaita.flows.keeper.keeper import Keeper, KeeperSettings
from plaita.flows.keeper.schedule_records import ScheduleRecorder, record_of
from plaita.flows.model.schedules import execution_id_of
from plaita.flows.schedule_listing import schedule_rows
from plaita.ops.keeper_build import build_keeper, build_scheduler
from plaita.ops.service import start_worker
from plaita.store.client import make_client
from plaita.store.executions.keeper_store import KEEPER_LEASE_KEY, keeper_lease_key
from plaita.store.executions.schedule_records import ScheduleRecords, records_key
from plaita.store.executions.store import ExecutionStore
from plaita.store.keyspace import DEFAULT, hash_tag
from plaita.store.streams.queue import StreamQueue
from tests.flows.test_schedules import T0
from tests.support.lease_workers import QUEUE, wait_for

pytestmark = pytest.mark.redis

SETTINGS = KeeperSettings(interval_s=0.1, lease_ttl_s=2.0)


def flow(flow_id: str, cron: str = "*/5 * * * *", **options: object) -> Flow:
    f = Flow(flow_id, schedule=Schedule(cron, **options))  # type: ignore[arg-type]
    f.step(lambda ctx: None, name="run")
    return f


class Node:
    """One keeper's (or worker's) view of a queue: its own client, queue and store."""

    def __init__(self, url: str, queue: str = QUEUE) -> None:
        self.client = make_client(url, socket_timeout_s=5.0)
        self.queue = StreamQueue(self.client, stream=queue, group="g", consumer="k", dlq_key="d", dlq_max_len=10)
        self.store = ExecutionStore(self.client, self.queue.keyspace)
        self.records = ScheduleRecords(self.client, queue)

    def keeper(self, flows: list[Flow] = (), clock_s: float = T0, **options: float) -> Keeper:  # type: ignore[assignment]
        """A keeper whose clock is ``self.now_s`` (set it between passes)."""
        self.now_s = clock_s
        scheduler = build_scheduler(flows, self.queue, store=self.store, **options)  # type: ignore[arg-type]
        return build_keeper(self.store, self.queue, SETTINGS, clock=lambda: self.now_s, scheduler=scheduler)

    def passes(self, keeper: Keeper, *clock_s: float) -> list[list[str]]:
        """What ``keeper`` started at each of these times."""
        out = []
        for now_s in clock_s:
            self.now_s = now_s
            out.append(keeper.run_once().scheduled)
        return out

    def started(self) -> list[str]:
        return [json.loads(f[b"payload"])["execution_id"] for _, f in self.client.xrange(self.queue.stream)]  # type: ignore[union-attr]


@pytest.fixture
def node(redis_url: str) -> Iterator[Node]:
    n = Node(redis_url)
    yield n
    n.client.close()


def test_keeper_leases_are_per_queue_and_the_default_queues_key_is_unchanged() -> None:
    assert keeper_lease_key(DEFAULT.queue) == KEEPER_LEASE_KEY == "plaita:keeper:lease"
    assert keeper_lease_key("jobs") == "plaita:keeper:lease:{jobs}"
    # A queue's keeper keys share its hash tag (one slot on a cluster), whatever the name holds.
    for queue in ("jobs", "a:b", "{app}:jobs", "x}y"):
        assert hash_tag(keeper_lease_key(queue)) == hash_tag(records_key(queue)) != ""


def test_a_keeper_on_each_queue_acts_and_a_second_one_of_a_queue_stands_by(redis_url: str) -> None:
    a, b, a2 = Node(redis_url, QUEUE), Node(redis_url, "plaita:test:other"), Node(redis_url, QUEUE)
    try:
        assert a.keeper().run_once().acting and b.keeper().run_once().acting
        assert not a2.keeper().run_once().acting
        assert {k.decode() for k in a.client.scan_iter("plaita:keeper:lease*")} == {
            keeper_lease_key(QUEUE),
            keeper_lease_key("plaita:test:other"),
        }
    finally:
        for n in (a, b, a2):
            n.client.close()


def test_a_keeper_without_the_flow_starts_the_ticks_a_worker_recorded(node: Node) -> None:
    assert ScheduleRecorder([flow("cron_jobs")], node.records).refresh(T0 - 100)
    # First seen between ticks, then the tick.
    assert node.passes(node.keeper(), T0 - 1, T0 + 1) == [[], [execution_id_of("cron_jobs", T0)]]
    [body] = [json.loads(f[b"payload"]) for _, f in node.client.xrange(QUEUE)]  # type: ignore[union-attr]
    assert body["flow_id"] == "cron_jobs" and body["params"]["scheduled"]["tick_s"] == T0


def test_a_flow_worker_records_its_schedules_when_it_starts(redis_url: str, node: Node) -> None:
    settings = Settings(redis_url=redis_url, queue_name=QUEUE, consumer_name="rec", read_block_ms=100)
    with start_worker(settings, flows=[flow("from_worker", missed="once", params={"k": 1})]):
        wait_for(lambda: "from_worker" in node.records.read(), 10, "the worker's record")
    record = json.loads(node.records.read()["from_worker"])
    assert record["cron"] == "*/5 * * * *" and record["missed"] == "once" and record["params"] == {"k": 1}
    assert abs(record["recorded_at_s"] - time.time()) < 30


def test_records_lost_with_the_data_are_recorded_again_by_the_next_pass(node: Node) -> None:
    ScheduleRecorder([flow("theirs")], node.records).refresh(T0)
    keeper = node.keeper([flow("mine")])
    keeper.run_once()
    assert sorted(node.records.read()) == ["mine", "theirs"]
    node.client.flushall()
    # A worker that records its own schedule before the keeper's next pass does not hide the loss.
    ScheduleRecorder([flow("third")], node.records).refresh(T0)
    keeper.run_once()
    assert sorted(node.records.read()) == ["mine", "theirs", "third"]
    assert [r["flow"] for r in schedule_rows([], node.store, T0)] == ["mine", "theirs", "third"]


def test_a_record_deleted_by_hand_is_not_written_back(node: Node) -> None:
    ScheduleRecorder([flow("theirs")], node.records).refresh(T0)
    keeper = node.keeper([flow("mine")])
    keeper.run_once()
    node.client.hdel(records_key(QUEUE), "theirs", "mine")
    keeper.run_once()
    assert list(node.records.read()) == ["mine"]  # its own, recorded again; the other stays deleted


def test_a_record_nobody_refreshes_for_its_ttl_stops_and_is_forgotten(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    ScheduleRecorder([flow("gone")], node.records).refresh(T0 - 3600)  # removed from the code since
    ScheduleRecorder([flow("kept")], node.records).refresh(T0 - 60)
    with caplog.at_level(logging.INFO, logger="plaita"):
        started = node.passes(node.keeper(record_ttl_s=600), T0 - 1, T0 + 1)
    assert started == [[], [execution_id_of("kept", T0)]]
    assert sorted(node.records.read()) == ["kept"]
    assert any("gone" in r.getMessage() and "forgotten" in r.getMessage() for r in caplog.records)


def test_a_refreshed_record_is_not_forgotten_by_a_keeper_that_read_it_stale(node: Node) -> None:
    stale = record_of(flow("back").schedule, T0 - 3600, "old")  # type: ignore[arg-type]
    node.records.write({"back": stale})
    assert node.records.forget("back", stale)
    node.records.write({"back": record_of(flow("back").schedule, T0, "new")})  # type: ignore[arg-type]
    assert not node.records.forget("back", stale)  # compare-and-delete: the fresh one stays
    assert "back" in node.records.read()


def test_a_bad_record_is_skipped_with_one_error_line_and_the_others_run(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    ScheduleRecorder([flow("good")], node.records).refresh(T0 - 100)
    never = json.dumps({"cron": "0 0 30 2 *", "tz": "UTC", "recorded_at_s": T0 - 100})
    node.client.hset(records_key(QUEUE), mapping={"garbled": "{not json", "never": never})
    keeper = node.keeper(clock_s=T0 - 1)
    with caplog.at_level(logging.ERROR, logger="plaita"):
        first = keeper.run_once()
        node.now_s = T0 + 1
        second = keeper.run_once()
    assert second.scheduled == [execution_id_of("good", T0)]
    bad = [f"{records_key(QUEUE)}#garbled", f"{records_key(QUEUE)}#never"]
    assert first.corrupt == second.corrupt == bad
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(lines) == 2 and "never fires" in lines[1], lines
    rows = {r["flow"]: r for r in schedule_rows([], node.store, T0)}
    assert "not JSON" in rows["garbled"]["error"] and "never fires" in rows["never"]["error"]
    assert rows["good"]["cron"] == "*/5 * * * *" and rows["good"]["recorded_at_s"] == T0 - 100


def test_a_wrong_typed_records_key_skips_only_the_recorded_schedules(node: Node) -> None:
    node.client.set(records_key(QUEUE), "not a hash")
    keeper = node.keeper([flow("mine")], T0 - 1)
    assert keeper.run_once().corrupt == [records_key(QUEUE)]
    assert node.passes(keeper, T0 + 1) == [[execution_id_of("mine", T0)]]
    rows = schedule_rows([], node.store, T0)
    assert rows[0]["flow"] == records_key(QUEUE) and "wrong type" in rows[0]["error"]
    assert [r["flow"] for r in rows[1:]] == ["mine"]
    assert node.client.get(records_key(QUEUE)) == b"not a hash"


def test_a_keeper_on_standby_records_its_own_schedules(node: Node, client: redis.Redis) -> None:
    client.set(keeper_lease_key(QUEUE), "keeper:other", px=60_000)
    report = node.keeper([flow("standby_flow")]).run_once()
    assert not report.acting and node.started() == []
    assert list(node.records.read()) == ["standby_flow"]
