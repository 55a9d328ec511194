"""Schedules at run time on Redis Cluster (issue 33 item 7): a pause (one key) holds every start
of the keeper's pass; a backfill's ticks go to the partitions their ids hash to, each with its
dedup key in its slot, and a second backfill starts nothing."""

from __future__ import annotations

import pytest

from plaita.config import Settings
from plaita.flows import Flow, Schedule
from plaita.flows.keeper.keeper import KeeperSettings
from plaita.flows.keeper.schedule_records import ScheduleRecorder
from plaita.flows.model.schedules import execution_id_of
from plaita.flows.producer.client import FlowClient
from plaita.flows.schedule_control import ScheduleControl
from plaita.ops.keeper_build import build_keeper
from plaita.store.executions.schedule_records import ScheduleRecords
from plaita.store.executions.store import ExecutionStore
from plaita.store.partitioned import open_queue
from tests.flows.test_schedules import T0
from tests.support.lease_workers import QUEUE
from tests.support.redis_cluster import ClusterServers

pytestmark = pytest.mark.redis


def test_pause_and_backfill_on_every_partition(clean_cluster: ClusterServers) -> None:
    fast = Flow("fast", schedule=Schedule("* * * * * *", grace_s=1.0))
    fast.step(lambda ctx: None, name="run")
    q = open_queue(Settings(redis_url=clean_cluster.url, queue_name=QUEUE, partitions=6))
    now_s = [float(T0)]
    keeper = build_keeper(
        ExecutionStore(q.client, q.keyspace), q, KeeperSettings(interval_s=0.1, lease_ttl_s=5), clock=lambda: now_s[0]
    )
    control = ScheduleControl(FlowClient(q), [fast])
    try:
        assert ScheduleRecorder([fast], ScheduleRecords(q.client, QUEUE)).refresh(T0)
        now_s[0] = T0 + 0.5
        assert keeper.run_once().scheduled == [execution_id_of("fast", T0)]
        assert control.pause("fast")
        for tick_s in range(T0 + 1, T0 + 6):
            now_s[0] = tick_s + 0.5
            assert keeper.run_once().scheduled == []  # paused: nothing starts
        ticks = control.backfill("fast", T0, T0 + 5)
        assert [t.started for t in ticks] == [False, True, True, True, True, True]
        assert len({q.keyspace.partition_of(t.execution_id) for t in ticks}) > 1  # spread over partitions
        assert [t.started for t in control.backfill("fast", T0, T0 + 5)] == [False] * 6
        assert all(FlowClient(q).get(t.execution_id) is not None for t in ticks)
        assert control.resume("fast")
        now_s[0] = T0 + 6.5
        assert keeper.run_once().scheduled == [execution_id_of("fast", T0 + 6)]
    finally:
        q.close()
