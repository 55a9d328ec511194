"""Delayed starts and tasks on Redis Cluster: each delayed set shares its partition stream's hash
tag, so a start's script (record + delayed member) and a worker's move (set -> stream) are each
single-slot on whichever master holds the partition; every delayed task runs once, a cancelled
one ends cancelled at the first pass, and ``plaita enqueue --delay-s`` routes like ``FlowClient``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from plaita.config import Settings
from plaita.flows.producer.client import FlowClient
from plaita.store.keyspace import hash_tag
from plaita.store.streams.delayed import delayed_count, delayed_key
from plaita.store.streams.partitioned import open_queue
from tests.cluster.test_cluster_ops import PARTITIONS, plaita
from tests.support.lease_workers import QUEUE, worker_proc
from tests.support.redis_cluster import ClusterServers
from tests.support.workers import wait_for

pytestmark = pytest.mark.redis


def test_delayed_starts_and_tasks_run_once_on_every_partition(clean_cluster: ClusterServers, tmp_path: Path) -> None:
    q = open_queue(Settings(redis_url=clean_cluster.url, queue_name=QUEUE, consumer_name="p", partitions=6))
    ks, flows = q.keyspace, FlowClient(q)
    assert all(hash_tag(delayed_key(s)) == hash_tag(s) != "" for s in q.streams)
    # One execution id per partition for the CLI, a dozen random ones for the client.
    by_cli = [next(f"cli-{i}" for i in range(500) if ks.partition_of(f"cli-{i}") == p) for p in range(6)]
    lines = "\n".join(json.dumps({"type": "start", "flow_id": "tally", "execution_id": e}) for e in by_cli)
    out = plaita(clean_cluster, "enqueue", "--delay-s", "1", stdin=lines + "\n")
    assert out.returncode == 0, out.stderr
    assert all(line.startswith("d-") for line in out.stdout.split())
    ids = [flows.start("tally", {"n": i}, delay_s=1) for i in range(12)]
    cancelled = flows.start("tally", {"n": 99}, delay_s=1)
    assert flows.cancel(cancelled).outcome == "queued"
    assert [(flows.get(e) or {}).get("status") for e in ids] == ["queued"] * 12
    assert delayed_count(q.client, q.streams) == 6 + 12 + 1
    args = ("--partitions", PARTITIONS, "--flows", "tests.cluster.cluster_flows", "--reclaim-interval-s", "0.2")
    with worker_proc(clean_cluster.url, tmp_path, "delayed", *args) as w:
        for e in ids + by_cli:
            wait_for(lambda e=e: (flows.get(e) or {}).get("status") == "completed", 60, f"{e} completed")
        wait_for(lambda: (flows.get(cancelled) or {}).get("status") == "cancelled", 60, "the cancelled start ended")
        assert w.terminate() == 0
    assert delayed_count(q.client, q.streams) == 0
    added = sum(int(q.client.xinfo_stream(s)["entries-added"]) for s in q.streams if q.client.exists(s))
    assert added == 6 + 12 + 1  # each moved once
    q.close()
