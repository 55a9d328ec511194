"""Issue 29, item 3 on Redis Cluster: keeper leases per queue and schedules recorded per queue
(each a single-key call, the queue's name its hash tag), started by a keeper that does not load
the flow, on every partition, and listed by ``plaita schedules list``."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from plaita.config import Settings
from plaita.flows import Flow, Schedule
from plaita.flows.keeper.keeper import KeeperSettings
from plaita.flows.keeper.schedule_records import ScheduleRecorder
from plaita.flows.model.schedules import execution_id_of
from plaita.ops.keeper_build import build_keeper
from plaita.store.executions.keeper_store import keeper_lease_key
from plaita.store.executions.schedule_records import ScheduleRecords
from plaita.store.executions.store import ExecutionStore
from plaita.store.streams.partitioned import open_queue
from tests.flows.test_schedules import T0
from tests.support.lease_workers import QUEUE
from tests.support.redis_cluster import ClusterServers
from tests.support.workers import ROOT

pytestmark = pytest.mark.redis

OTHER = "plaita:test:other"


def test_each_queues_keeper_starts_the_schedules_recorded_for_it(clean_cluster: ClusterServers) -> None:
    fast = Flow("fast", schedule=Schedule("* * * * * *", grace_s=1.0))
    fast.step(lambda ctx: None, name="run")
    queues = [open_queue(Settings(redis_url=clean_cluster.url, queue_name=q, partitions=3)) for q in (QUEUE, OTHER)]
    now_s = [float(T0)]
    keepers = [
        build_keeper(
            ExecutionStore(q.client, q.keyspace),
            q,
            KeeperSettings(interval_s=0.1, lease_ttl_s=5),
            clock=lambda: now_s[0],
        )
        for q in queues
    ]
    c = clean_cluster.client()
    try:
        assert ScheduleRecorder([fast], ScheduleRecords(queues[0].client, QUEUE)).refresh(T0)
        started = []
        for tick_s in range(T0, T0 + 6):
            now_s[0] = tick_s + 0.5
            reports = [k.run_once() for k in keepers]
            assert all(r.acting for r in reports)  # one lease per queue: both act
            assert reports[1].scheduled == []  # nothing recorded for the other queue
            started += reports[0].scheduled
        assert started == [execution_id_of("fast", t) for t in range(T0, T0 + 6)]
        ks = queues[0].keyspace
        assert len({ks.partition_of(e) for e in started}) > 1  # spread over the partitions
        assert c.exists(keeper_lease_key(QUEUE), keeper_lease_key(OTHER)) == 2
        cmd = [sys.executable, "-m", "plaita", "schedules", "list", "--json"]
        cmd += ["--redis-url", clean_cluster.url, "--queue-name", QUEUE, "--partitions", "3"]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=str(ROOT))
        assert done.returncode == 0, done.stderr
        [row] = json.loads(done.stdout)
        assert row["flow"] == "fast" and row["last_execution_id"] == started[-1] and row["recorded_at_s"] == T0
    finally:
        for q in queues:
            q.close()
