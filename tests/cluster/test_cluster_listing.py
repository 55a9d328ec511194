"""``FlowClient.list`` on Redis Cluster: the status indexes of six partitions (spread over three
masters) and two tenants merge into one newest-first order, paged by cursor with no repeat and no
gap while executions start, and the CLI's ``executions list --all-tenants`` pages the same way."""

from __future__ import annotations

import json

import pytest

from plaita.config import Settings
from plaita.flows.producer.client import FlowClient
from plaita.store.streams.partitioned import open_queue
from tests.cluster.test_cluster_ops import plaita
from tests.support.lease_workers import QUEUE
from tests.support.redis_cluster import ClusterServers

pytestmark = pytest.mark.redis


def test_paging_merges_every_partition_and_tenant(clean_cluster: ClusterServers) -> None:
    flows = FlowClient(open_queue(Settings(redis_url=clean_cluster.url, queue_name=QUEUE, partitions=6)))
    t1 = flows.for_tenant("t1")
    started = [(client.start("nap", {"i": i}), client.tenant_id) for i in range(40) for client in (flows, t1)]
    assert len({flows.queue.keyspace.partition_of(e) for e, _ in started}) == 6
    seen: list[tuple[str, str]] = []
    meanwhile: list[str] = []
    page = flows.list(all_tenants=True, limit=15)
    for _ in range(20):
        seen += [(r.execution_id, r.tenant) for r in page.rows]
        if page.cursor is None:
            break
        meanwhile.append(flows.start("nap"))  # newer than the cursor: never in a later page
        page = flows.list(all_tenants=True, limit=15, cursor=page.cursor)
    assert seen == list(reversed(started)) and len(meanwhile) == 5  # 80 rows, 15 a page
    assert [r.execution_id for r in t1.list(limit=100).rows] == [e for e, t in reversed(started) if t == "t1"]
    r = plaita(clean_cluster, "executions", "list", "--all-tenants", "--status", "queued", "--limit", "200", "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert [d["execution_id"] for d in rows[:5]] == list(reversed(meanwhile))
    assert len(rows) == 80 + 5 and {d["tenant"] for d in rows} == {"default", "t1"}
    flows.queue.close()
