"""Issue 31, items 1 and 2 on Redis Cluster: the start's one script (dedup answer, queued record,
XADD) touches only keys of its execution's partition tag, so it runs on whichever master holds
that slot; repeated starts with one dedup key get one id on every partition, and the
worker's create takes each queued record over there."""

from __future__ import annotations

from pathlib import Path

import pytest

from plaita.config import Settings
from plaita.flows.producer.client import FlowClient
from plaita.store.streams.partitioned import open_queue
from tests.cluster.test_cluster_ops import PARTITIONS
from tests.support.lease_workers import QUEUE, worker_proc
from tests.support.redis_cluster import ClusterServers
from tests.support.workers import wait_for

pytestmark = pytest.mark.redis


def test_dedup_and_queued_records_on_every_partition(clean_cluster: ClusterServers, tmp_path: Path) -> None:
    """Before: no record until a worker ran the start, and a second start with the key got an id of its own."""
    q = open_queue(Settings(redis_url=clean_cluster.url, queue_name=QUEUE, consumer_name="p", partitions=6))
    flows = FlowClient(q)
    ks = q.keyspace
    keys = [next(f"key-{i}" for i in range(200) if ks.partition_of(f"key-{i}") == p) for p in range(6)]
    tenant = flows.for_tenant("t1")
    ids = [flows.start("nap", {"timeout_s": 3600}, dedup_key=k) for k in keys]
    ids += [tenant.start("nap", {"timeout_s": 3600}, dedup_key=k) for k in keys]
    assert [flows.start("nap", {}, dedup_key=k) for k in keys] == ids[:6]
    assert [tenant.start("nap", {}, dedup_key=k) for k in keys] == ids[6:]
    assert [(flows.get(e) or {}).get("status") for e in ids[:6]] == ["queued"] * 6
    assert [(tenant.get(e) or {}).get("status") for e in ids[6:]] == ["queued"] * 6
    assert flows.store.counts()["queued"] == 6 and tenant.store.counts()["queued"] == 6
    args = ("--partitions", PARTITIONS, "--flows", "tests.cluster.cluster_flows", "--read-block-ms", "200")
    with worker_proc(clean_cluster.url, tmp_path, "starts", *args) as w:
        for producer, eids in ((flows, ids[:6]), (tenant, ids[6:])):
            for e in eids:
                wait_for(lambda p=producer, e=e: (p.get(e) or {}).get("status") == "suspended", 20, f"{e} taken over")
        assert w.terminate() == 0
    assert flows.store.counts()["queued"] == 0 and tenant.store.counts()["queued"] == 0
    q.close()
