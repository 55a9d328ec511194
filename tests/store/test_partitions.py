"""Partitions on one real server: the keyspace, routing, fair reads, and each queue operation
reaching its own partition (Redis Cluster itself: tests/cluster)."""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.crc import key_slot

from plaita.config import ConfigError, Settings
from plaita.store.keyspace import DEFAULT, Keyspace, partition_tag
from plaita.store.leases import LeaseManager
from plaita.store.stats import is_settled, stream_stats
from plaita.store.streams.dlq import DeadLetterQueue
from plaita.store.streams.entries import DeadLetter
from plaita.store.streams.levels import LeveledQueue
from plaita.store.streams.partitioned import PartitionedQueue, open_queue
from tests.support.redis_server import free_port

QUEUE = "plaita:test:pq"
GROUP = "plaita-workers"


def slot(key: str) -> int:
    return key_slot(key.encode())


class TestKeyspace:
    """Pure: which key each thing lives at."""

    def test_one_untagged_partition_is_exactly_the_original_keys(self) -> None:
        """A single-node deployment with the default partitions changes nothing."""
        ks = Keyspace("plaita:flow:queue")
        assert (ks.stream(0), ks.dlq(0)) == ("plaita:flow:queue", "plaita:flow:queue:dlq")
        assert ks.lease_key("e1") == "plaita:execution:lease:e1" == DEFAULT.lease_key("e1")
        assert ks.fence_key("e1") == "plaita:execution:fence:e1"
        assert ks.execution_key("e1") == "plaita:execution:e1"
        assert ks.cancel_key("e1") == "plaita:execution:cancel:e1"
        assert ks.status_key(0, "running") == "plaita:executions:status:running"
        assert ks.deadlines_key(0) == "plaita:executions:deadlines"
        assert ks.dedup_key(0, "k") == "plaita:start-dedup:k"
        assert ks.qualify(0, "1-0") == "1-0"

    def test_every_key_of_an_execution_shares_its_partition_stream_slot(self) -> None:
        """Each atomic script touches one slot: stream, DLQ, lease, fence, state, cancel, indexes."""
        ks = Keyspace("plaita:flow:queue", 6, tagged=True)
        for eid in ("e1", "order-42", "é/ü", "7/1-0"):
            p = ks.partition_of(eid)
            keys = [
                ks.stream(p), ks.dlq(p), ks.lease_key(eid), ks.fence_key(eid), ks.execution_key(eid),
                ks.cancel_key(eid), ks.status_key(p, "running"), ks.deadlines_key(p), ks.dedup_key(p, "d"),
                ks.index_keeps_key(p),
            ]  # fmt: skip
            assert len({slot(k) for k in keys}) == 1, keys
            assert all(k.startswith("plaita:") for k in keys)  # inside the ACL's ~plaita:* pattern

    def test_partition_of_is_crc32_so_any_producer_can_route(self) -> None:
        ks = Keyspace("q", 6, tagged=True)
        for eid in ("a", "b", "order-1", "ünï"):
            assert ks.partition_of(eid) == zlib.crc32(eid.encode()) % 6
        # A qualified message id (a plain task's lease name) belongs to the partition it names.
        assert ks.partition_of("4/1700000000000-3") == 4
        assert ks.unqualify("4/1-0") == (4, "1-0")
        with pytest.raises(ValueError):
            ks.unqualify("9/1-0")

    @pytest.mark.parametrize("partitions", [3, 6, 12])
    def test_tags_spread_evenly_over_equal_slot_ranges(self, partitions: int) -> None:
        """Three masters from `redis-cli --cluster create` own equal thirds: each gets N/3 partitions."""
        owners = [slot(partition_tag(i, partitions)) * 3 // 16384 for i in range(partitions)]
        assert sorted(owners) == sorted([m for m in range(3) for _ in range(partitions // 3)])

    def test_settings_refuse_bad_partition_options(self) -> None:
        for kwargs, text in [
            ({"partitions": 0}, "--partitions must be within"),
            ({"partitions": 4, "partitions_assigned": (1, 4)}, "--partitions-assigned"),
            ({"partitions": 4, "partitions_assigned": ()}, "--partitions-assigned"),
            ({"partitions": 2, "queue_name": "{app}:q"}, "must not contain '{'"),
            ({"redis_url": "redis+cluster://127.0.0.1:7000", "dlq_key": "d{x}"}, "must not contain '{'"),
            ({"redis_url": "redis+cluster://127.0.0.1:7000/3"}, "only database 0"),
            ({"redis_url": "redis+cluster://u:s3cret@127.0.0.1"}, "host:port"),
        ]:
            with pytest.raises(ConfigError, match=text) as info:
                Settings(**kwargs)  # type: ignore[arg-type]
            assert "s3cret" not in str(info.value)


@pytest.fixture
def pq(redis_url: str) -> Iterator[PartitionedQueue]:
    q = open_queue(Settings(redis_url=redis_url, queue_name=QUEUE, consumer_name="c1", partitions=4))
    assert isinstance(q, PartitionedQueue)
    yield q
    q.close()


def exec_body(eid: str, n: int = 0) -> dict[str, object]:
    return {"type": "start", "flow_id": "f", "execution_id": eid, "params": {"n": n}}


@pytest.mark.redis
class TestPartitionedQueue:
    def test_plain_settings_give_the_plain_queue(self, redis_url: str) -> None:
        q = open_queue(Settings(redis_url=redis_url, queue_name=QUEUE))
        # A plain stream with its priority levels (none in use: today's keys, today's reads).
        assert type(q) is LeveledQueue and q.stream == QUEUE and q.level_streams() == [QUEUE]
        q.close()

    def test_enqueue_routes_by_execution_id(self, pq: PartitionedQueue, rclient: redis.Redis) -> None:
        bodies = [exec_body(f"e{i}") for i in range(40)] + [exec_body("e1", 99)]
        ids = pq.enqueue_many(bodies)
        for body, qid in zip(bodies, ids, strict=True):
            p, mid = pq.keyspace.unqualify(qid)
            assert p == pq.keyspace.partition_of(str(body["execution_id"]))
            assert rclient.xrange(pq.keyspace.stream(p), mid, mid)
        assert ids[1].split("/")[0] == ids[-1].split("/")[0]  # one execution, one partition
        assert sorted(rclient.xlen(pq.keyspace.stream(p)) > 0 for p in range(4)) == [True] * 4

    def test_a_busy_partition_does_not_starve_the_others(self, pq: PartitionedQueue) -> None:
        """100 tasks on one partition, one on each other: the first read already takes all four."""
        pq.ensure_group()
        by_partition: dict[int, list[str]] = {}
        for i in range(400):
            by_partition.setdefault(pq.keyspace.partition_of(f"x{i}"), []).append(f"x{i}")
        busy = by_partition[0][:100]
        pq.enqueue_many([exec_body(e) for e in busy] + [exec_body(by_partition[p][0]) for p in (1, 2, 3)])
        first = pq.read_new(4, 100)
        assert sorted(int(e.message_id.split("/")[0]) for e in first) == [0, 1, 2, 3]

    def test_read_blocks_briefly_when_every_partition_is_empty(self, pq: PartitionedQueue) -> None:
        pq.ensure_group()
        assert pq.read_new(10, 200) == []
        pq.enqueue(exec_body("late"))
        got = pq.read_new(10, 200)
        assert [e.message_id for e in got] and got[0].message_id.startswith(f"{pq.keyspace.partition_of('late')}/")

    def test_a_read_without_block_never_blocks_even_when_every_partition_is_empty(self, redis_url: str) -> None:
        """``block_ms`` 0 is the worker's read ahead: a batch already read waits on it unleased, so it
        must not BLOCK (as on a plain queue), only sweep the partitions once."""
        blocks: list[int | None] = []

        class Recording(redis.Redis):  # a real client that notes each XREADGROUP's BLOCK
            def xreadgroup(self, *args: Any, **kwargs: Any) -> Any:
                blocks.append(kwargs.get("block"))
                return super().xreadgroup(*args, **kwargs)

        settings = Settings(redis_url=redis_url, queue_name=QUEUE, consumer_name="c1", partitions=4)
        q = open_queue(settings, read_client=Recording.from_url(redis_url, socket_timeout=5))
        try:
            q.ensure_group()
            assert q.read_new(10, 0) == [] and q.read_new(10, 0) == []
            assert all(b is None for b in blocks), blocks
            q.enqueue(exec_body("late"))
            assert [e.message_id.split("/")[0] for e in q.read_new(10, 0)] == [str(q.keyspace.partition_of("late"))]
        finally:
            q.close()

    def test_settle_acks_and_releases_in_each_partition(self, pq: PartitionedQueue, rclient: redis.Redis) -> None:
        pq.ensure_group()
        eids = [f"s{i}" for i in range(12)]
        pq.enqueue_many([exec_body(e) for e in eids])
        entries = pq.read_new(20, 100)
        leases = LeaseManager(pq.client, consumer="c1", ttl_s=30, keyspace=pq.keyspace)
        got = leases.acquire_many(eids)
        assert all(not isinstance(g, str) for g in got)
        releases = [(g.key, g.value) for g in got if not isinstance(g, str)]
        assert pq.settle([e.message_id for e in entries], [], releases) == []
        assert is_settled(pq)
        assert not any(rclient.exists(k) for k, _ in releases)

    def test_a_partition_whose_settle_fails_keeps_its_leases(self, pq: PartitionedQueue, rclient: redis.Redis) -> None:
        """Each partition's leases are released in its own MULTI, with its own acks: when partition 3's
        server (settled last) is unreachable, its leases stay held (its tasks are still pending) while the others'
        are released. (Releasing every lease with partition 0's settle passes on one server otherwise.)"""
        pq.ensure_group()
        eids = [f"r{i}" for i in range(16)]
        pq.enqueue_many([exec_body(e) for e in eids])
        entries = pq.read_new(32, 100)
        got = LeaseManager(pq.client, consumer="c1", ttl_s=30, keyspace=pq.keyspace).acquire_many(eids)
        releases = [(g.key, g.value) for g in got if not isinstance(g, str)]
        by_part = {e: pq.keyspace.partition_of(e) for e in eids}
        assert len(releases) == 16 and set(by_part.values()) == {0, 1, 2, 3}
        pq.parts[3].client = redis.Redis(host="127.0.0.1", port=free_port(), socket_connect_timeout=1)
        with pytest.raises(redis.ConnectionError):
            pq.settle([e.message_id for e in entries], [], releases)
        held = {e for e in eids if rclient.exists(pq.keyspace.lease_key(e))}
        assert held == {e for e, p in by_part.items() if p == 3}, "partition 3's leases, and only those, are held"

    def test_claim_renew_and_hand_back_reach_every_partition(self, pq: PartitionedQueue, redis_url: str) -> None:
        pq.ensure_group()
        pq.enqueue_many([exec_body(f"c{i}") for i in range(16)])
        dead = open_queue(Settings(redis_url=redis_url, queue_name=QUEUE, consumer_name="dead", partitions=4))
        taken = dead.read_new(16, 100) + dead.read_new(16, 100)
        assert len(taken) == 16
        cursor, claimed = "0-0", []
        for _ in range(20):  # bounded: each call claims up to one per partition, until every cursor ends
            cursor, entries, _skipped = pq.claim_unleased(cursor, 0, 4)
            claimed += entries
            if cursor == "0-0":
                break
        assert sorted(e.message_id for e in claimed) == sorted(e.message_id for e in taken)
        assert all(e.delivery_count == 2 for e in claimed)
        assert sorted(pq.renew_pending([e.message_id for e in claimed])) == sorted(e.message_id for e in claimed)
        pq.hand_back([(e.message_id, e.fields or {}) for e in claimed], [])
        assert stream_stats(pq)["pending"] == 0 and stream_stats(pq)["length"] == 16
        dead.close()

    def test_a_claim_never_takes_more_than_its_budget(self, pq: PartitionedQueue, redis_url: str) -> None:
        """One free slot, four partitions with abandoned work: each call claims at most one."""
        pq.ensure_group()
        pq.enqueue_many([exec_body(f"b{i}") for i in range(16)])
        dead = open_queue(Settings(redis_url=redis_url, queue_name=QUEUE, consumer_name="dead", partitions=4))
        assert len(dead.read_new(16, 100) + dead.read_new(16, 100)) == 16
        cursor, total = "0-0", 0
        for _ in range(40):  # bounded: one claim per call
            cursor, entries, _skipped = pq.claim_unleased(cursor, 0, 1)
            assert len(entries) <= 1
            total += len(entries)
            if cursor == "0-0":
                break
        assert total == 16
        dead.close()

    def test_own_pending_is_resumed_partition_by_partition(self, pq: PartitionedQueue) -> None:
        pq.ensure_group()
        pq.enqueue_many([exec_body(f"o{i}") for i in range(12)])
        first = pq.read_new(12, 100) + pq.read_new(12, 100)
        seen, cursor = [], "0"
        for _ in range(20):
            page = pq.read_own_pending(cursor, 2)
            if not page:
                break
            seen += page
            cursor = page[-1].message_id
        assert sorted(e.message_id for e in seen) == sorted(e.message_id for e in first)
        assert len(seen) == 12

    def test_dead_letters_stay_in_their_partition_and_requeue_there(
        self, pq: PartitionedQueue, rclient: redis.Redis
    ) -> None:
        pq.ensure_group()
        pq.enqueue_many([exec_body(f"d{i}") for i in range(8)])
        entries = pq.read_new(8, 100) + pq.read_new(8, 100)
        dead = [DeadLetter(e.message_id, "bad", 1, json.loads((e.fields or {})["payload"]), e.fields) for e in entries]
        assert pq.settle([], dead) == []
        dlq = DeadLetterQueue(pq)
        assert dlq.length() == 8 and stream_stats(pq)["dlq_length"] == 8
        rows = dlq.oldest(100)
        assert {r["dlq_id"].split("/")[0] for r in rows} == {e.message_id.split("/")[0] for e in entries}
        for r in rows:
            p = int(r["dlq_id"].split("/")[0])
            assert r["source_stream"] == pq.keyspace.stream(p)
        moved = dlq.requeue([r["dlq_id"] for r in rows])
        assert [a.split("/")[0] for a, _ in moved] == [b.split("/")[0] for _, b in moved]
        assert dlq.length() == 0 and stream_stats(pq)["length"] == 8
        body = json.loads(rclient.xrange(pq.keyspace.stream(int(moved[0][1].split("/")[0])))[0][1]["payload"])
        assert body["type"] == "start"
