"""Issue 33 item 3 on Redis Cluster: ``max_concurrent_per_key`` holds across the partitions of every
master (the key's slots and parked starts share the flow's hash tag), and a per-key limit raised
at run time (``LimitControl``) reaches the running worker and promotes the parked starts onto
their own partitions' streams."""

from __future__ import annotations

from pathlib import Path

import pytest

from plaita.flows import LimitControl
from plaita.flows.producer.client import FlowClient
from tests.support.lease_workers import wait_for, worker_proc
from tests.support.redis_cluster import ClusterServers

pytestmark = pytest.mark.redis


def test_per_key_concurrency_and_a_run_time_raise_on_a_cluster(
    clean_cluster: ClusterServers, tmp_path: Path, cluster_flows: FlowClient
) -> None:
    flows, q = cluster_flows, cluster_flows.queue
    control = LimitControl(flows)
    client = clean_cluster.client()

    def count(kind: str, customer: str) -> int:
        return int(client.get(f"plaita:test:{{keyedc}}:{kind}:{customer}") or 0)

    def waiting() -> int:
        return int(control.show("keyedc")[0]["waiting"])

    args = ("--partitions", "6", "--flows", "tests.cluster.cluster_flows", "--read-block-ms", "200")
    with worker_proc(clean_cluster.url, tmp_path, "keyed", *args, "--concurrency", "4") as w:
        first = [flows.start("keyedc", {"customer": "c:1", "hold_s": 0.05}) for _ in range(6)]
        other = flows.start("keyedc", {"customer": "c:2"})
        assert len({q.keyspace.partition_of(e) for e in first}) > 1
        assert [flows.wait(e, 60)["status"] for e in [*first, other]] == ["completed"] * 7
        gated = [flows.start("keyedc", {"customer": "c:3", "gate": True}) for _ in range(3)]
        wait_for(lambda: count("running", "c:3") == 1 and waiting() == 2, 60, "one of c:3 runs, two park")
        control.set("keyedc", max_concurrent_per_key=3)
        wait_for(lambda: count("running", "c:3") == 3, 30, "the raised per-key limit let all three run")
        client.set("plaita:test:{keyedc}:gate", "1")
        assert [flows.wait(e, 60)["status"] for e in gated] == ["completed"] * 3
        assert w.terminate() == 0
        counters = w.counters()
    assert count("max", "c:1") == 1 and count("max", "c:3") == 3
    assert counters.get("handed_back", 0) == 0
    assert waiting() == 0
