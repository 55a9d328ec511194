"""The named tasks' store on a real server: the due set moves due tasks (and only those) onto
their partition's stream, each once, in bounded calls; results keep their TTL."""

from __future__ import annotations

import json
import threading

import pytest
import redis

from plaita.config import Settings
from plaita.store.streams.partitioned import open_queue
from plaita.store.streams.queue import StreamQueue
from plaita.store.task_store import PROMOTE_BATCH, PROMOTE_PASSES, TaskStore, task_store_of

pytestmark = pytest.mark.redis


def _store(redis_url: str, partitions: int = 1) -> tuple[StreamQueue, TaskStore]:
    queue = open_queue(Settings(redis_url=redis_url, queue_name="ts:q", consumer_name="c", partitions=partitions))
    return queue, task_store_of(queue)


def test_only_due_tasks_move_each_once_even_with_two_promoters(redis_url: str, rclient: redis.Redis) -> None:
    queue, store = _store(redis_url, partitions=3)
    try:
        for n in range(50):
            store.add_later({"type": "task", "task": "t", "task_id": f"due-{n}"}, 0)
        store.add_later({"type": "task", "task": "t", "task_id": "later"}, 3600)
        moved: list[int] = []
        threads = [threading.Thread(target=lambda: moved.append(store.promote_due())) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert sum(moved) == 50 and store.waiting() == 1
        ks = queue.keyspace
        entries = [e for p in range(3) for e in rclient.xrange(ks.stream(p))]
        ids = sorted(json.loads(fields["payload"])["task_id"] for _, fields in entries)
        assert ids == sorted(f"due-{n}" for n in range(50))
        assert {fields["schema_version"] for _, fields in entries} == {"1"}
        assert len({p for p in range(3) if rclient.xlen(ks.stream(p))}) > 1  # spread over partitions
    finally:
        queue.close()


def test_a_backlog_moves_in_bounded_passes_and_a_body_with_an_execution_id_goes_home(
    redis_url: str, rclient: redis.Redis
) -> None:
    queue, store = _store(redis_url, partitions=4)
    try:
        eid = "exec-7"
        store.add_later({"type": "task", "task": "t", "task_id": "x", "execution_id": eid}, 0)
        assert store.promote_due() == 1
        home = queue.keyspace.stream(queue.keyspace.partition_of(eid))
        assert rclient.xlen(home) == 1
        store.client.delete(home)
        backlog = PROMOTE_BATCH * PROMOTE_PASSES + 5  # one partition: every body has the same execution id
        for n in range(backlog):
            store.add_later({"type": "task", "task": "t", "task_id": f"b{n}", "execution_id": eid}, 0)
        assert store.promote_due() == PROMOTE_BATCH * PROMOTE_PASSES  # one call is bounded
        assert store.promote_due() == 5 and store.waiting() == 0
        assert rclient.xlen(home) == backlog
    finally:
        queue.close()


def test_results_keep_their_ttl_and_a_queued_mark_never_overwrites_one(redis_url: str, rclient: redis.Redis) -> None:
    queue, store = _store(redis_url)
    try:
        store.put_result("r1", {"state": "done", "value": [1, "二"]}, ttl_s=30)
        store.mark_queued("r1", ttl_s=3600)
        assert store.get_result("r1") == {"state": "done", "value": [1, "二"]}
        assert 0 < rclient.pttl("ts:q:result:r1") <= 30_000
        store.mark_queued("id:with%colon", ttl_s=60)  # ids are escaped into the key (key_id)
        assert rclient.exists("ts:q:result:id%3Awith%25colon") == 1
        store.forget("r1")
        assert store.get_result("r1") is None
    finally:
        queue.close()
