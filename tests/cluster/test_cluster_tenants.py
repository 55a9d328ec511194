"""Tenants on Redis Cluster: a tenant's execution keys carry their partition's tag after the
tenant's namespace (``plaita:t1:execution:{p…}:ID``), so every script stays in one slot, and
the same ids in two tenants stay two executions on every master."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from plaita.config import Settings
from plaita.flows.producer.client import FlowClient
from plaita.store.keyspace import hash_tag
from plaita.store.streams.partitioned import open_queue
from tests.cluster.test_cluster_ops import PARTITIONS, plaita
from tests.support.lease_workers import QUEUE, worker_proc
from tests.support.redis_cluster import ClusterServers
from tests.support.workers import wait_for

pytestmark = pytest.mark.redis


def _status(flows: FlowClient, eid: str) -> object:
    return (flows.get(eid) or {}).get("status")


def test_two_tenants_same_ids_on_every_partition(clean_cluster: ClusterServers, tmp_path: Path) -> None:
    q = open_queue(Settings(redis_url=clean_cluster.url, queue_name=QUEUE, consumer_name="p", partitions=6))
    flows = FlowClient(q)
    t1 = flows.for_tenant("t1")
    ks = q.keyspace
    ids = [next(f"same-{i}" for i in range(200) if ks.partition_of(f"same-{i}") == p) for p in range(6)]
    args = ("--partitions", PARTITIONS, "--flows", "tests.cluster.cluster_flows", "--read-block-ms", "200")
    with worker_proc(clean_cluster.url, tmp_path, "tenants", *args) as w:
        for e in ids:
            flows.start("nap", {"timeout_s": 3600}, execution_id=e)
            t1.start("nap", {"timeout_s": 3600}, execution_id=e)
        fan = t1.start("fan", {"n": 6})  # children of a tenant's parent are the tenant's, on every master
        for producer in (flows, t1):
            for e in ids:
                wait_for(lambda p=producer, e=e: _status(p, e) == "suspended", 20, f"{e} suspended")
        for e in ids:
            t1.resume(e, "event")
        t1_docs = [t1.wait(e, 30) for e in ids]
        joined = t1.wait(fan, 30)
        assert [_status(flows, e) for e in ids] == ["suspended"] * 6
        flows.cancel(ids[0])
        assert flows.wait(ids[0], 30)["status"] == "cancelled" and _status(t1, ids[0]) == "completed"
        assert w.terminate() == 0
    assert [d["state"]["resumed_by"] for d in t1_docs] == ["event"] * 6
    assert joined["status"] == "completed" and [c[1] for c in joined["state"]["outcomes"]] == ["completed"] * 6
    client = clean_cluster.client()
    tenant_ks = ks.for_tenant("t1")
    for e in ids:
        key = tenant_ks.execution_key(e)
        assert key == f"plaita:t1:execution:{ks.slot_tag(e)}:{e}" and hash_tag(key) == ks.slot_tag(e)
        assert client.type(key) == b"string" and client.type(ks.execution_key(e)) == b"string"
    children = [c[0] for c in joined["state"]["outcomes"]]
    assert len(children) == 6
    assert [client.exists(tenant_ks.execution_key(c)) for c in children] == [1] * 6
    assert [client.exists(ks.execution_key(c)) for c in children] == [0] * 6
    listed = plaita(clean_cluster, "executions", "list", "--tenant", "t1", "--status", "completed", "--json")
    assert listed.returncode == 0, listed.stderr
    assert {d["execution_id"] for d in json.loads(listed.stdout)} == {*ids, fan, *children}
    default = plaita(clean_cluster, "executions", "list", "--status", "completed", "--json")
    assert json.loads(default.stdout) == []
    q.close()
