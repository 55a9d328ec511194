"""Priorities on a real server: level streams beside each partition's stream, read higher first,
one fair read in four (counted, no timing), acks/claims/renewals/dead letters reaching their level,
delayed tasks landing on their level, cancel finding a priority start, statistics counting levels,
and a producer without priorities writing exactly today's keys."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.crc import key_slot

from plaita.clock import wall_s
from plaita.config import Settings
from plaita.flows.producer.client import FlowClient
from plaita.store.acl import PRODUCER_ACL_RULES, WORKER_ACL_RULES, setuser_command
from plaita.store.keyspace import Keyspace, check_priority, level_stream, levels_key, split_level
from plaita.store.stats import is_settled, stream_stats
from plaita.store.streams.delayed import add_tasks, delayed_key
from plaita.store.streams.dlq import DeadLetterQueue
from plaita.store.streams.entries import DeadLetter
from plaita.store.streams.levels import FAIR_EVERY, LeveledQueue
from plaita.store.streams.partitioned import open_queue
from plaita.store.streams.queue import StreamQueue
from plaita.testing import TestClock

pytestmark = pytest.mark.redis

QUEUE = "plaita:test:prio"


def _open(redis_url: str, consumer: str = "c1", **changes: Any) -> StreamQueue:
    return open_queue(Settings(redis_url=redis_url, queue_name=QUEUE, consumer_name=consumer, **changes))


@pytest.fixture
def producer(redis_url: str) -> Iterator[StreamQueue]:
    q = _open(redis_url, "p")
    yield q
    q.close()


def _level_of(entry_id: str) -> int:
    return split_level(entry_id.split("/", 1)[1] if entry_id.count("/") == 2 else entry_id)[0]


def _levels_read(q: StreamQueue, reads: int) -> list[int]:
    out = []
    for _ in range(reads):
        [entry] = q.read_new(1, 0)
        out.append(_level_of(entry.message_id))
        q.ack(entry.message_id)
    return out


def test_the_keys_of_a_level_share_the_partition_slot_and_bad_priorities_are_refused() -> None:
    ks = Keyspace("plaita:flow:queue", 6, tagged=True)
    for p in range(6):
        keys = [ks.stream(p), level_stream(ks.stream(p), 9), levels_key(ks.stream(p)), ks.dlq(p)]
        keys.append(delayed_key(level_stream(ks.stream(p), 9)))
        assert len({key_slot(k.encode()) for k in keys}) == 1, keys
    assert level_stream("q", 0) == "q" and level_stream("q", 3) == "q:prio3"
    assert ks.partition_of("4/9/1-0") == 4 and ks.lease_key("4/9/1-0").startswith(ks.lease_prefix(4))
    for bad in (-1, 10, 1.5, True, "9", None):
        with pytest.raises(ValueError, match="priority must be an int within 0..9"):
            check_priority(bad)


def test_a_producer_without_priority_writes_todays_keys_only(redis_url: str, rclient: redis.Redis) -> None:
    q = _open(redis_url)
    assert isinstance(q, LeveledQueue)
    q.ensure_group()
    q.enqueue({"type": "start", "flow_id": "f", "execution_id": "e1"})
    add_tasks(q, [{"type": "start", "flow_id": "f", "execution_id": "e2"}], delay_s=60)
    assert sorted(rclient.keys("*")) == [QUEUE, QUEUE + ":delayed"]
    assert q.level_streams() == [QUEUE]


def test_a_backlog_is_read_highest_level_first_with_one_fair_read_in_four(
    redis_url: str, producer: StreamQueue
) -> None:
    producer.enqueue_many([{"type": "start", "flow_id": "f", "execution_id": f"low{i}"} for i in range(20)])
    producer.enqueue_many([{"n": i} for i in range(20)], priority=5)
    producer.enqueue_many([{"n": i} for i in range(20)], priority=9)
    q = _open(redis_url)
    q.ensure_group()
    # Reads 1-3 highest first; read 4 starts at the round robin's next level (0 first, then 5,
    # then 9): every level with a backlog gets a read in every FAIR_EVERY x 3.
    assert FAIR_EVERY == 4
    assert _levels_read(q, 12) == [9, 9, 9, 0, 9, 9, 9, 5, 9, 9, 9, 9]
    # A batch fills from the top down: 9's backlog (10 left), then level 5.
    batch = q.read_new(12, 0)
    assert [_level_of(e.message_id) for e in batch] == [9] * 10 + [5] * 2


def test_a_crashed_consumers_level_entry_is_claimed_renewed_and_acked_once(
    redis_url: str, producer: StreamQueue, rclient: redis.Redis
) -> None:
    mid = producer.enqueue({"n": 1}, priority=9)
    assert mid.startswith("9/")
    crashed, successor = _open(redis_url, "dead"), _open(redis_url, "alive")
    crashed.ensure_group()
    [entry] = crashed.read_new(10, 0)
    assert entry.message_id == mid  # the crashed consumer never acks
    successor.ensure_group()
    cursor, claimed, skipped = successor.claim_unleased("0-0", 0, 10)
    assert [e.message_id for e in claimed] == [mid] and skipped == 0
    assert claimed[0].delivery_count == 2
    assert successor.renew_pending([mid]) == [mid]
    assert crashed.renew_pending([mid]) == []  # no longer its own
    assert successor.delivery_counts([mid]) == {mid: 2}
    successor.settle([mid], [])
    assert rclient.xlen(level_stream(QUEUE, 9)) == 0
    assert is_settled(successor)
    # Nothing is left to claim on any level: the cursor runs through the levels to the end.
    while cursor != "0-0":
        cursor, claimed, _ = successor.claim_unleased(cursor, 0, 10)
        assert claimed == []


def test_a_level_entry_is_dead_lettered_and_handed_back_on_its_own_stream(
    redis_url: str, producer: StreamQueue, rclient: redis.Redis
) -> None:
    producer.enqueue_many([{"n": 1}, {"n": 2}], priority=7)
    q = _open(redis_url)
    q.ensure_group()
    first, second = q.read_new(2, 0)
    dead = DeadLetter(first.message_id, "test", 1, {"n": 1}, first.fields)
    assert q.settle([], [dead]) == []
    [row] = rclient.xrange(QUEUE + ":dlq")
    assert level_stream(QUEUE, 7) in row[1]["payload"]
    [back] = DeadLetterQueue(q).requeue([DeadLetterQueue(q).all_ids()[0]])
    assert back[1].startswith("7/")  # requeued on the level it came from
    assert rclient.xlen(level_stream(QUEUE, 7)) == 2  # the handed-out second and the requeued first
    assert second.fields is not None
    q.hand_back([(second.message_id, second.fields)], [], timeout_s=None)
    again = q.read_new(5, 0) or q.read_own_pending("0", 5)
    assert [_level_of(e.message_id) for e in again] == [7, 7]  # the requeued one and the handed-back one


def test_a_delayed_priority_task_lands_on_its_level_when_due(redis_url: str, rclient: redis.Redis) -> None:
    with TestClock() as clock:
        q = _open(redis_url)
        q.ensure_group()
        [member] = add_tasks(q, [{"n": 1}], delay_s=3600, priority=3)
        assert member.startswith("d-") and rclient.zcard(delayed_key(level_stream(QUEUE, 3))) == 1
        assert q.move_due(int(wall_s() * 1000)) == 0
        clock.advance(3601)
        assert q.move_due(int(wall_s() * 1000)) == 1
        assert rclient.xlen(level_stream(QUEUE, 3)) == 1 and rclient.xlen(QUEUE) == 0
        [entry] = q.read_new(5, 0)
        assert entry.message_id.startswith("3/")


def test_a_queued_or_delayed_priority_start_is_found_by_cancel(redis_url: str, rclient: redis.Redis) -> None:
    q = _open(redis_url, "p")
    flows = FlowClient(q)
    eid = flows.start("f", {}, priority=8)
    assert rclient.xlen(level_stream(QUEUE, 8)) == 1 and not rclient.exists(QUEUE)
    rclient.delete(q.keyspace.execution_key(eid))  # as an older producer's start: no document
    assert flows.cancel(eid).outcome == "queued"  # found on the level stream
    later = flows.start("f", {}, priority=8, delay_s=3600)
    assert flows.cancel(later).outcome == "queued"
    [(_, score)] = rclient.zrange(delayed_key(level_stream(QUEUE, 8)), 0, -1, withscores=True)
    assert score == 0  # made due now in its level's set: the next move runs it, cancelled
    with pytest.raises(ValueError, match="priority"):
        flows.start("f", {}, priority=10)


def test_statistics_count_the_level_streams(redis_url: str, producer: StreamQueue) -> None:
    producer.enqueue_many([{"n": i} for i in range(3)])
    producer.enqueue_many([{"n": i} for i in range(4)], priority=9)
    q = _open(redis_url)
    q.ensure_group()
    q.read_new(2, 0)
    stats = stream_stats(q)
    assert stats["length"] == 7 and stats["pending"] == 2 and stats["lag"] == 5
    assert stats["levels"] == {"0": 3, "9": 4}


def test_partitions_with_priorities_read_level_nine_of_every_partition_first(redis_url: str) -> None:
    producer = _open(redis_url, "p", partitions=3)
    producer.enqueue_many([{"type": "start", "flow_id": "f", "execution_id": f"lo{i}"} for i in range(12)])
    top = producer.enqueue_many(
        [{"type": "start", "flow_id": "f", "execution_id": f"hi{i}"} for i in range(6)], priority=9
    )
    assert {mid.split("/")[0] for mid in top} == {"0", "1", "2"} and all(m.split("/")[1] == "9" for m in top)
    q = _open(redis_url, partitions=3)
    q.ensure_group()
    # The first read after idle shares its batch over the partitions (level 9 only), the next
    # fills up level 9 across them before any level 0.
    batch: list[Any] = []
    while len(batch) < 6:
        batch += q.read_new(6, 0)
    assert sorted(e.message_id for e in batch[:6]) == sorted(top)
    q.settle([e.message_id for e in batch[:6]], [])
    while len(batch) < 18:
        batch += q.read_new(12, 0)
    assert len(batch) == 18 and stream_stats(q)["pending"] == 12
    assert stream_stats(q)["levels"] == {"0": 12, "9": 0}  # summed over the partitions


def test_a_read_without_levels_costs_todays_one_command(redis_url: str, rclient: redis.Redis) -> None:
    q = _open(redis_url)
    q.ensure_group()
    rclient.config_resetstat()
    for _ in range(50):
        q.read_new(10, 0)
    stats = rclient.info("commandstats")
    assert stats["cmdstat_xreadgroup"]["calls"] == 50
    # One SMEMBERS per LEVELS_REFRESH_S (1 s): at most 2 in a run this short.
    assert stats.get("cmdstat_smembers", {"calls": 0})["calls"] <= 2


def test_the_producer_and_worker_acls_suffice_for_priorities(redis_url: str, rclient: redis.Redis) -> None:
    """SADD (producer), SMEMBERS and the read script's XREADGROUP (worker): nothing refused."""
    rclient.execute_command("ACL", "LOG", "RESET")  # the server is shared: other tests' refusals
    for user, rules in (("prio-producer", PRODUCER_ACL_RULES), ("prio-worker", WORKER_ACL_RULES)):
        rclient.execute_command(*setuser_command(user, "pw", rules))
    port = redis_url.rsplit(":", 1)[1]
    flows = FlowClient.from_url(f"redis://prio-producer:pw@127.0.0.1:{port}", queue_name=QUEUE)
    producer = flows.queue
    started = flows.start("f", {}, priority=6)
    producer.enqueue({"n": 1})
    worker = _open(f"redis://prio-worker:pw@127.0.0.1:{port}")
    worker.ensure_group()
    batch = worker.read_new(10, 0)
    assert [_level_of(e.message_id) for e in batch] == [6, 0]
    worker.settle([e.message_id for e in batch], [])
    assert is_settled(worker) and flows.cancel(started).outcome == "queued"
    add_tasks(producer, [{"n": 2}], delay_s=60, priority=6)
    assert worker.move_due(0) == 0
    # redis-py's optional CLIENT SETINFO may be refused and logged (docs/operations.md): nothing else.
    assert [e for e in rclient.acl_log() if not str(e["object"]).startswith("client|")] == []
    flows.close()


def test_a_blocking_read_over_several_ready_levels_keeps_its_count_and_hands_the_rest_back(
    redis_url: str, producer: StreamQueue
) -> None:
    """Only streams filled at the same moment during a BLOCK give more than the batch: the
    highest level's are kept, the rest go back unread (not charged a delivery)."""
    producer.enqueue({"n": 0})
    producer.enqueue({"n": 9}, priority=9)
    q = _open(redis_url)
    q.ensure_group()
    assert isinstance(q, LeveledQueue)
    [kept] = q._read_blocking([9, 0], 1, 100)
    assert _level_of(kept.message_id) == 9
    [again] = q.read_new(5, 0)  # the level-0 entry is new again, not pending to us
    assert _level_of(again.message_id) == 0 and again.delivery_count == 1
    assert stream_stats(q)["pending"] == 2
