"""Ids that look like the key layout on Redis Cluster: every execution keeps its own keys (in its
partition's slot), and ``plaita migrate ids`` moves old-layout keys within their slot."""

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


def test_ids_named_like_keys_alias_nothing_and_migrate_on_a_cluster(
    clean_cluster: ClusterServers, tmp_path: Path
) -> None:
    q = open_queue(Settings(redis_url=clean_cluster.url, queue_name=QUEUE, consumer_name="p", partitions=6))
    flows, tenant = FlowClient(q), FlowClient(q).for_tenant("execution")
    args = ("--partitions", PARTITIONS, "--flows", "tests.cluster.cluster_flows", "--read-block-ms", "200")
    client = clean_cluster.client()
    with worker_proc(clean_cluster.url, tmp_path, "ids", *args) as w:
        flows.start("tally", {"n": 1}, execution_id="execution:abc")
        tenant.start("tally", {"n": 2}, execution_id="abc")
        flows.start("tally", {"n": 3}, execution_id="cancel:victim")
        flows.start("nap", {"timeout_s": 3600}, execution_id="lease:hold")
        wait_for(lambda: _status(flows, "lease:hold") == "suspended", 30, "lease:hold suspended")
        for eid in ("victim", "hold"):
            flows.start("tally", {"n": 4}, execution_id=eid)
        docs = {e: flows.wait(e, 30) for e in ("execution:abc", "cancel:victim", "victim", "hold")}
        mine = tenant.wait("abc", 30)
        # An old-layout key, as an older worker wrote it, moved back by the migration.
        ks = q.keyspace
        new = ks.execution_key("lease:hold")
        old = new.replace("%3A", ":")
        assert hash_tag(old) == hash_tag(new)
        client.rename(new, old)
        migrated = plaita(clean_cluster, "migrate", "ids", "--json")
        assert migrated.returncode == 0, migrated.stderr
        assert json.loads(migrated.stdout)["moved"] >= 1 and client.exists(new) == 1
        flows.resume("lease:hold", "event")
        assert flows.wait("lease:hold", 30)["status"] == "completed"
        assert w.terminate() == 0
    assert [d["status"] for d in docs.values()] == ["completed"] * 4
    assert docs["execution:abc"]["params"] == {"n": 1} and mine["params"] == {"n": 2}
    assert docs["victim"]["params"] == {"n": 4} and docs["cancel:victim"]["params"] == {"n": 3}
    q.close()
