"""A flow's fleet-wide limit on Redis Cluster: its slot keys have a hash tag of their own, so a
flow whose executions live on every master (six partitions) is limited by single-slot scripts;
its waiting starts are parked there and put back on their own partitions' streams (issue 31,
item 4: none handed back to be re-read, each read at most twice)."""

from __future__ import annotations

from pathlib import Path

import pytest

from plaita.flows.producer.client import FlowClient
from tests.support.lease_workers import worker_proc
from tests.support.redis_cluster import ClusterServers

pytestmark = pytest.mark.redis


def test_max_concurrent_spans_every_partition_of_a_cluster(
    clean_cluster: ClusterServers, tmp_path: Path, cluster_flows: FlowClient
) -> None:
    flows, q = cluster_flows, cluster_flows.queue
    args = ("--partitions", "6", "--flows", "tests.cluster.cluster_flows", "--read-block-ms", "200")
    with worker_proc(clean_cluster.url, tmp_path, "limits", *args, "--concurrency", "4") as w:
        eids = [flows.start("capped") for _ in range(12)]
        assert len({q.keyspace.partition_of(e) for e in eids}) > 1
        docs = [flows.wait(eid, 60) for eid in eids]
        assert w.terminate() == 0
        # Read after the stop, which writes the status file at once: while running it is written
        # every so often, and it read all zeros once, taken right after the last execution ended.
        counters = w.counters()
    assert counters.get("handed_back", 0) == 0
    assert len(eids) < counters.get("completed", 0) <= 2 * len(eids), counters  # parked ones read twice
    assert [d["status"] for d in docs] == ["completed"] * 12
    client = clean_cluster.client()
    assert client.get("plaita:test:{capped}:max") == b"1"
    assert client.get("plaita:test:{capped}:running") == b"0"
