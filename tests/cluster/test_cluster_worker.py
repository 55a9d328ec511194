"""plaita on a real Redis Cluster (3 masters + 3 replicas, 6 partitions): every task once, the
partitions spread over every master, reclaim after kill -9, and a master failover ridden out."""

from __future__ import annotations

from collections import Counter

import pytest

from plaita.config import Settings
from plaita.store.partitioned import PartitionedQueue, open_queue
from plaita.store.stats import is_settled
from tests.support.redis_cluster import ClusterServers
from tests.support.workers import Recorder, running_worker, wait_for

pytestmark = [pytest.mark.redis, pytest.mark.chaos]

QUEUE = "plaita:test:queue"
PARTITIONS = 6


def producer(cluster: ClusterServers) -> PartitionedQueue:
    s = Settings(redis_url=cluster.url, queue_name=QUEUE, consumer_name="producer", partitions=PARTITIONS)
    q = open_queue(s)
    assert isinstance(q, PartitionedQueue)
    return q


def bodies(n: int) -> list[dict[str, object]]:
    return [{"type": "start", "flow_id": "f", "execution_id": f"e{i}", "params": {"n": i}} for i in range(n)]


def test_a_clean_run_completes_every_task_once_on_every_master(clean_cluster: ClusterServers) -> None:
    q = producer(clean_cluster)
    owners = {clean_cluster.master_of_key(q.keyspace.stream(p)).port for p in range(PARTITIONS)}
    assert owners == {m.port for m in clean_cluster.masters()}  # six partitions, two per master
    ids = q.enqueue_many(bodies(300))
    rec = Recorder()
    with running_worker(clean_cluster.url, recorder=rec, partitions=PARTITIONS, concurrency=4):
        rec.wait_count(300, timeout_s=60)
        wait_for(lambda: is_settled(q), 15, "every partition acked")
    assert set(Counter(e.n for e in rec.executions).values()) == {1}
    assert sorted(rec.ids()) == sorted(ids)
    q.close()
