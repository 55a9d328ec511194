"""Issue 18, reproduction 6 on Redis Cluster: unreadable execution keys on several partitions
(several slots, several masters) are skipped by the keeper and named by ``executions list``,
and the others are still found."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from plaita.config import Settings
from plaita.flows.keeper.keeper import KeeperSettings
from plaita.ops.keeper_build import build_keeper
from plaita.store.executions.store import ExecutionStore, UnreadableExecution
from plaita.store.streams.partitioned import open_queue
from tests.support.lease_workers import QUEUE
from tests.support.redis_cluster import ClusterServers
from tests.support.workers import ROOT

pytestmark = pytest.mark.redis


def test_unreadable_keys_on_every_partition_are_skipped(clean_cluster: ClusterServers) -> None:
    q = open_queue(Settings(redis_url=clean_cluster.url, queue_name=QUEUE, consumer_name="u", partitions=3))
    ks, c = q.keyspace, clean_cluster.client()
    store = ExecutionStore(q.client, ks)
    by_partition = {ks.partition_of(f"e-{i}"): f"e-{i}" for i in range(30)}
    good, corrupt, typed = by_partition[0], by_partition[1], by_partition[2]
    doc = {"execution_id": good, "flow_id": "f", "status": "suspended", "suspension": {"seq": 1}}
    c.set(ks.execution_key(good), json.dumps(doc))
    c.set(ks.execution_key(corrupt), "garbage{")
    c.hset(ks.execution_key(typed), "status", "suspended")
    for eid in (good, corrupt, typed):
        p = ks.partition_of(eid)
        c.zadd(ks.deadlines_key(p), {eid: 1})
        c.zadd(ks.status_key(p, "suspended"), {eid: time.time()})
    read = store.read_many([good, corrupt, typed, "missing"])
    assert read[0] == doc and read[3] is None
    assert [type(r) for r in read[1:3]] == [UnreadableExecution, UnreadableExecution]
    report = build_keeper(store, q, KeeperSettings(interval_s=0.1, lease_ttl_s=2)).run_once()
    assert report.timeouts == [good] and sorted(report.corrupt) == sorted([corrupt, typed])
    cmd = [sys.executable, "-m", "plaita", "--quiet", "executions", "list", "--json"]
    cmd += ["--redis-url", clean_cluster.url, "--queue-name", QUEUE, "--partitions", "3"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=str(ROOT))
    assert r.returncode == 0 and [d["execution_id"] for d in json.loads(r.stdout)] == [good], r.stderr
    assert len(r.stderr.strip().splitlines()) == 2 and corrupt in r.stderr and typed in r.stderr
    q.close()
    c.close()
