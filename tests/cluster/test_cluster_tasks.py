"""Named tasks on Redis Cluster (6 partitions over 3 masters): each partition's due set carries its
stream's hash tag (the promote script touches one slot), retries and delayed tasks come back on
every partition, and results are read back from whichever master holds their key."""

from __future__ import annotations

import pytest

from plaita import Settings, TaskClient, TaskFailed, start_worker
from plaita.store.keyspace import hash_tag
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
    )
    with (
        start_worker(settings, tasks="tests.support.named_tasks"),
        TaskClient.from_url(clean_cluster.url, queue_name=QUEUE, partitions=PARTITIONS) as client,
    ):
        ks = client.queue.keyspace
        for p in range(PARTITIONS):  # one slot per script: the due set is in its stream's slot
            assert hash_tag(client.store.due_key(p)) == hash_tag(ks.stream(p)) != ""
        sums = [client.enqueue("add", [n, n]) for n in range(12)]
        flaky = [client.enqueue("fails_once", [f"c{n}"]) for n in range(12)]
        delayed = [client.enqueue("add", [n, 1], delay_s=0.3) for n in range(6)]
        failing = client.enqueue("always_fails", ["cluster"])
        assert [client.result(t, timeout_s=WAIT_S) for t in sums] == [2 * n for n in range(12)]
        assert {client.result(t, timeout_s=WAIT_S) for t in flaky} == {"ok on attempt 2"}
        assert [client.result(t, timeout_s=WAIT_S) for t in delayed] == [n + 1 for n in range(6)]
        with pytest.raises(TaskFailed, match="boom 3"):
            client.result(failing, timeout_s=WAIT_S)
        assert client.store.waiting() == 0  # every retry and delayed task came back from its due set
