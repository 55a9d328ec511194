"""Priorities on Redis Cluster: each level stream, its delayed set and the levels set share their
partition stream's hash tag, so every per-partition script stays single-slot; a reader takes level 9
of every partition first; a worker process runs every start (now, delayed, handed back) once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from plaita.config import Settings
from plaita.flows.producer.client import FlowClient
from plaita.store.keyspace import hash_tag, level_stream, levels_key
from plaita.store.streams.delayed import delayed_key
from plaita.store.streams.partitioned import open_queue
from tests.cluster.test_cluster_ops import PARTITIONS
from tests.support.lease_workers import QUEUE, worker_proc
from tests.support.redis_cluster import ClusterServers
from tests.support.workers import wait_for

pytestmark = pytest.mark.redis


def test_priority_starts_read_first_and_run_once_on_every_partition(
    clean_cluster: ClusterServers, tmp_path: Path
) -> None:
    settings = Settings(redis_url=clean_cluster.url, queue_name=QUEUE, consumer_name="p", partitions=6)
    q = open_queue(settings)
    flows = FlowClient(q)
    for s in q.streams:
        keys = [level_stream(s, 9), levels_key(s), delayed_key(level_stream(s, 9))]
        assert {hash_tag(k) for k in keys} == {hash_tag(s)} != {""}
    low = [flows.start("tally", {"n": i}) for i in range(12)]
    high = [flows.start("tally", {"n": i}, priority=9) for i in range(12)]
    later = flows.start("tally", {"n": 99}, priority=5, delay_s=1)
    reader = open_queue(Settings(redis_url=clean_cluster.url, queue_name=QUEUE, consumer_name="r", partitions=6))
    reader.ensure_group()
    batch: list[Any] = []
    while len(batch) < 12:  # after idle a read shares its batch over the partitions
        batch += reader.read_new(12 - len(batch), 0)
    assert len(batch) == 12 and all(e.message_id.split("/")[1] == "9" for e in batch)
    reader.hand_back([(e.message_id, e.fields or {}) for e in batch], [], timeout_s=None)
    reader.close()
    args = ("--partitions", PARTITIONS, "--flows", "tests.cluster.cluster_flows", "--reclaim-interval-s", "0.2")
    with worker_proc(clean_cluster.url, tmp_path, "prio", *args) as w:
        for e in [*low, *high, later]:
            wait_for(lambda e=e: (flows.get(e) or {}).get("status") == "completed", 60, f"{e} completed")
        assert w.terminate() == 0
    for e in [*low, *high, later]:
        assert q.client.get(f"plaita:test:tally:{e}:{q.keyspace.slot_tag(e)}") == b"2"  # each step once
    q.close()
