"""Named tasks on Redis Cluster (6 partitions over 3 masters): retries and delayed tasks wait in
each partition's delayed set (its stream's hash tag: the move script touches one slot) and come
back on every partition, and results are read back from whichever master holds their key."""

from __future__ import annotations

import pytest

from plaita import Settings, TaskClient, TaskFailed, start_worker
from plaita.store.keyspace import hash_tag
from plaita.store.streams.delayed import delayed_count, delayed_key
from tests.support import named_tasks
from tests.support.redis_cluster import ClusterServers

pytestmark = pytest.mark.redis

QUEUE = "plaita:test:named"
PARTITIONS = 6
WAIT_S = 60.0


def test_named_tasks_retry_and_keep_results_on_every_partition(clean_cluster: ClusterServers) -> None:
    named_tasks.CALLS.clear()
    settings = Settings(
        redis_url=clean_cluster.url,
        queue_name=QUEUE,
        consumer_name="named-cluster",
        partitions=PARTITIONS,
        read_block_ms=100,
        registry_enabled=False,
        concurrency=4,
        reclaim_interval_s=0.2,  # retries come back on the reclaim pass
    )
    with (
        start_worker(settings, tasks="tests.support.named_tasks"),
        TaskClient.from_url(clean_cluster.url, queue_name=QUEUE, partitions=PARTITIONS) as client,
    ):
        ks = client.queue.keyspace
        for p in range(PARTITIONS):  # one slot per script: the delayed set is in its stream's slot
            assert hash_tag(delayed_key(ks.stream(p))) == hash_tag(ks.stream(p)) != ""
        sums = [client.enqueue("add", [n, n]) for n in range(12)]
        flaky = [client.enqueue("fails_once", [f"c{n}"]) for n in range(12)]
        delayed = [client.enqueue("add", [n, 1], delay_s=0.3) for n in range(6)]
        failing = client.enqueue("always_fails", ["cluster"])
        assert [client.result(t, timeout_s=WAIT_S) for t in sums] == [2 * n for n in range(12)]
        assert {client.result(t, timeout_s=WAIT_S) for t in flaky} == {"ok on attempt 2"}
        assert [client.result(t, timeout_s=WAIT_S) for t in delayed] == [n + 1 for n in range(6)]
        with pytest.raises(TaskFailed, match="boom 3"):
            client.result(failing, timeout_s=WAIT_S)
        # Every retry and delayed task came back from its delayed set.
        assert delayed_count(client.queue.client, client.queue.streams) == 0
