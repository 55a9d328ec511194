"""Status index scores as the create and checkpoint scripts write them (``execution_io.index_score``),
on a real server: the running index takes the whole second of a step (an integer score, which a
listpack zset stores without a float to parse on every insert), every other index the exact
time; and numbers the scripts pass on (a retention, a staged write's TTL) reach Redis as whole
numbers even when the caller's were floats."""

from __future__ import annotations

import json

import pytest
import redis

from plaita.store.executions.execution_io import checkpoint_now, create_now, index_score
from plaita.store.executions.staged import Staged
from plaita.store.executions.store import ExecutionStore
from plaita.store.leases import Lease, LeaseManager

pytestmark = pytest.mark.redis

RUNNING, COMPLETED = "plaita:executions:status:running", "plaita:executions:status:completed"


def test_the_running_index_scores_whole_seconds_and_the_others_exact_times() -> None:
    assert index_score(1700000000.75, "running") == "1700000000"  # rounded down: never newer than the step
    assert index_score(1700000000.75, "completed") == "1700000000.75"
    assert index_score(1700000000.0, "suspended") == "1700000000.0"


def _leased(client: redis.Redis, eid: str) -> int:
    lease = LeaseManager(client, consumer="scores", ttl_s=30.0).acquire(eid)
    assert isinstance(lease, Lease)
    return lease.generation


def _doc(eid: str, status: str) -> str:
    return json.dumps({"execution_id": eid, "status": status, "flow_id": "f"})


def test_a_step_moves_the_running_score_to_its_second_and_the_end_is_exact(bclient: redis.Redis) -> None:
    store, eid = ExecutionStore(bclient), "scored-1"
    generation = _leased(bclient, eid)
    assert create_now(store, eid, generation, _doc(eid, "running"), 1700000000.9, None)[0] == 1
    assert bclient.zscore(RUNNING, eid) == 1700000000.0
    assert checkpoint_now(store, eid, generation, _doc(eid, "running"), status="running", now_s=1700000001.5) == (
        True,
        False,
    )
    assert bclient.zscore(RUNNING, eid) == 1700000001.0
    ended = checkpoint_now(
        store, eid, generation, _doc(eid, "completed"), status="completed", now_s=1700000002.25, retention_s=3600.0
    )
    assert ended == (True, False)
    assert bclient.zscore(RUNNING, eid) is None and bclient.zscore(COMPLETED, eid) == 1700000002.25
    assert 3500 < int(bclient.ttl(f"plaita:execution:{eid}")) <= 3600  # a float retention still expires


def test_a_staged_write_with_a_float_ttl_expires_as_its_whole_seconds(bclient: redis.Redis) -> None:
    store, eid = ExecutionStore(bclient), "scored-2"
    generation = _leased(bclient, eid)
    assert create_now(store, eid, generation, _doc(eid, "running"), 1700000000.0, None)[0] == 1
    staged = [Staged("set", "app:scored-2:note", "hello", 50.0)]  # type: ignore[arg-type]
    written = checkpoint_now(
        store, eid, generation, _doc(eid, "running"), status="running", now_s=1700000001.0, staged=staged
    )
    assert written == (True, False)
    assert bclient.get("app:scored-2:note") == b"hello" and 40 < int(bclient.ttl("app:scored-2:note")) <= 50
