"""Fork and retention on Redis Cluster (issue 33 items 5 and 6): a fork of an execution on every
partition runs from its step in the new id's slot; ``executions delete`` leaves no key of the
deleted executions on any master and every key of their neighbours; ``prune`` finds ended
executions through every partition's index."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from plaita.config import Settings
from plaita.flows.producer.client import FlowClient
from plaita.store.keyspace import key_id
from plaita.store.partitioned import open_queue
from tests.cluster.test_cluster_ops import PARTITIONS, plaita
from tests.support.lease_workers import QUEUE, worker_proc
from tests.support.redis_cluster import ClusterServers

pytestmark = pytest.mark.redis


def _keys(cluster: ClusterServers) -> set[str]:
    out: set[str] = set()
    for node in cluster.masters():
        c = cluster.node_client(node.port, timeout_s=5.0)
        try:
            out |= {k.decode() for k in c.scan_iter(count=1000)}
        finally:
            c.close()
    return out


def _members(cluster: ClusterServers, keys: set[str]) -> dict[str, set[str]]:
    client = cluster.client()
    return {k: {m.decode() for m in client.zrange(k, 0, -1)} for k in keys if client.type(k) == b"zset"}


def test_fork_delete_and_prune_on_every_partition(clean_cluster: ClusterServers, tmp_path: Path) -> None:
    q = open_queue(Settings(redis_url=clean_cluster.url, queue_name=QUEUE, consumer_name="p", partitions=6))
    flows = FlowClient(q)
    ks = q.keyspace
    ids = [next(f"e{i}" for i in range(300) if ks.partition_of(f"e{i}") == p) for p in range(6)]
    neighbours = [f"{e}-n" for e in ids] + [e[:-1] + "x" for e in ids]
    args = ("--partitions", PARTITIONS, "--flows", "tests.cluster.cluster_flows", "--read-block-ms", "200")
    with worker_proc(clean_cluster.url, tmp_path, "ret", *args) as w:
        for e in [*ids, *neighbours]:
            flows.start("tally", {"n": 1}, execution_id=e, dedup_key=e)
        for e in [*ids, *neighbours]:
            assert flows.wait(e, 30)["status"] == "completed"
        forks = [flows.fork(e, "two", f"fork-{e}") for e in ids]
        docs = [flows.wait(f, 30) for f in forks]
        assert w.terminate() == 0
    assert [d["status"] for d in docs] == ["completed"] * 6
    assert [d["results"] for d in docs] == [{"one": {"one": 1}, "two": {"two": 1}}] * 6
    client = clean_cluster.client()
    tallies = [client.get(f"plaita:test:tally:{f}:{ks.slot_tag(f)}") for f in forks]
    assert tallies == [b"1"] * 6  # only step two ran in each fork
    assert [flows.events(f) for f in forks] == [{"ran_one": 1, "ran_two": 1}] * 6  # one's event copied
    before = _keys(clean_cluster)
    r = plaita(clean_cluster, "executions", "delete", *ids, "--json")
    assert r.returncode == 0, r.stderr
    after = _keys(clean_cluster)
    victims = {key_id(e) for e in ids}
    left = [k for k in after if victims & set(k.split(":")) and not k.startswith("plaita:test:")]
    assert left == [], left
    assert all(ids[0] not in m and ids[5] not in m for m in _members(clean_cluster, after).values())
    gone = before - after
    assert all(victims & set(k.split(":")) or k.startswith("plaita:start-dedup:") for k in gone), gone
    assert all(flows.get(n) is not None for n in [*neighbours, *forks])
    for f in forks:  # the forks ended long ago, as far as their index says
        client.zadd(ks.status_key(ks.partition_of(f), "completed"), {f: time.time() - 30 * 86400})
    pruned = flows.prune(time.time() - 7 * 86400)
    assert sorted(pruned.deleted) == sorted(forks) and not pruned.more
    assert all(flows.get(f) is None for f in forks) and all(flows.get(n) is not None for n in neighbours)
    q.close()
