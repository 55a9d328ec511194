"""The named tasks' store on a real server: results keep their TTL, and a task added later waits
in its partition's delayed set (tests/store/test_delayed.py tests the set and its moves)."""

from __future__ import annotations

import pytest
import redis

from plaita.config import Settings
from plaita.store.streams.delayed import delayed_count, delayed_key
from plaita.store.streams.partitioned import open_queue
from plaita.store.streams.queue import StreamQueue
from plaita.store.task_store import TaskStore, task_store_of

pytestmark = pytest.mark.redis


def _store(redis_url: str, partitions: int = 1) -> tuple[StreamQueue, TaskStore]:
    queue = open_queue(Settings(redis_url=redis_url, queue_name="ts:q", consumer_name="c", partitions=partitions))
    return queue, task_store_of(queue)


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


def test_a_task_added_later_waits_in_its_partitions_delayed_set(redis_url: str, rclient: redis.Redis) -> None:
    """Named-task bodies (no execution id) spread over the partitions by their text; one with an
    execution id goes to its execution's partition; a zero delay is on the stream at once."""
    queue, store = _store(redis_url, partitions=3)
    try:
        ks, streams = queue.keyspace, queue.streams
        for n in range(30):
            store.add_later({"type": "task", "task": "t", "task_id": f"later-{n}"}, 60)
        store.add_later({"type": "task", "task": "t", "task_id": "x", "execution_id": "exec-7"}, 60)
        assert delayed_count(rclient, streams) == 31 and sum(rclient.xlen(s) for s in streams) == 0
        assert len([s for s in streams if rclient.zcard(delayed_key(s))]) > 1  # spread over partitions
        home = delayed_key(ks.stream(ks.partition_of("exec-7")))
        assert any('"exec-7"' in m for m in rclient.zrange(home, 0, -1))
        store.add_later({"type": "task", "task": "t", "task_id": "now"}, 0)
        assert sum(rclient.xlen(s) for s in streams) == 1
    finally:
        queue.close()
