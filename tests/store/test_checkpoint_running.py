"""``checkpoint_running``, a still-running step's checkpoint by the task that indexed the execution
running itself (``checkpoint_call(after_running=True)``), on a real server: the same reply and
fence as the full checkpoint, the running index and the state written, nothing else touched; and
when ``checkpoint_call`` takes it (never with a deadline, a staged write or another status)."""

from __future__ import annotations

import json

import pytest
import redis

from plaita.store.executions.execution_io import (
    CHECKPOINT,
    CHECKPOINT_RUNNING,
    checkpoint_call,
    checkpoint_now,
    create_now,
)
from plaita.store.executions.staged import ExecutionKeyError, Staged
from plaita.store.executions.store import ExecutionStore
from plaita.store.keyspace import Keyspace
from plaita.store.leases import Lease, LeaseManager

RUNNING = "plaita:executions:status:running"


def _doc(eid: str, step: int) -> str:
    return json.dumps({"execution_id": eid, "status": "running", "flow_id": "f", "step": step})


@pytest.mark.parametrize(
    ("kw", "slim"),
    [
        ({"status": "running"}, True),
        ({"status": "running", "deadline_s": 5.0}, False),
        ({"status": "running", "staged": [Staged("set", "app:k", "v")]}, False),
        ({"status": "suspended"}, False),
        ({"status": "completed", "retention_s": 60}, False),
    ],
)
def test_the_slim_script_is_taken_only_for_a_plain_running_write(kw: dict[str, object], slim: bool) -> None:
    ks = Keyspace("plaita:tasks")
    call = checkpoint_call(None, ks, "e", 1, "{}", now_s=1.0, after_running=True, **kw)  # type: ignore[arg-type]
    assert call.script is (CHECKPOINT_RUNNING if slim else CHECKPOINT)
    assert checkpoint_call(None, ks, "e", 1, "{}", now_s=1.0, **kw).script is CHECKPOINT  # type: ignore[arg-type]


@pytest.mark.redis
def test_it_writes_the_state_and_the_running_score_under_the_fence(bclient: redis.Redis) -> None:
    store, eid = ExecutionStore(bclient), "slim-1"
    leases = LeaseManager(bclient, consumer="slim", ttl_s=30.0)
    lease = leases.acquire(eid)
    assert isinstance(lease, Lease)
    assert create_now(store, eid, lease.generation, _doc(eid, 0), 1700000000.0, None)[0] == 1
    step = checkpoint_now(
        store, eid, lease.generation, _doc(eid, 1), status="running", now_s=1700000005.5, after_running=True
    )
    assert step == (True, False)
    assert json.loads(bclient.get(f"plaita:execution:{eid}"))["step"] == 1  # type: ignore[arg-type]
    assert bclient.zscore(RUNNING, eid) == 1700000005.0
    others = [store.ks.status_key(0, s) for s in ("suspended", "completed", "error", "cancelled")]
    assert [bclient.zscore(k, eid) for k in [*others, store.ks.deadlines_key(0)]] == [None] * 5
    bclient.set(store.ks.cancel_key(eid), "1")  # the cancel flag comes back with the write
    assert checkpoint_now(
        store, eid, lease.generation, _doc(eid, 2), status="running", now_s=1700000006.0, after_running=True
    ) == (True, True)
    leases.release(lease)
    stale = checkpoint_now(
        store, eid, lease.generation, _doc(eid, 3), status="running", now_s=1700000007.0, after_running=True
    )
    assert stale == (False, False)  # fenced out: nothing written
    assert json.loads(bclient.get(f"plaita:execution:{eid}"))["step"] == 2  # type: ignore[arg-type]


@pytest.mark.redis
def test_a_running_index_of_the_wrong_type_is_refused_with_nothing_written(bclient: redis.Redis) -> None:
    store, eid = ExecutionStore(bclient), "slim-2"
    lease = LeaseManager(bclient, consumer="slim", ttl_s=30.0).acquire(eid)
    assert isinstance(lease, Lease)
    assert create_now(store, eid, lease.generation, _doc(eid, 0), 1700000000.0, None)[0] == 1
    bclient.delete(RUNNING)
    bclient.set(RUNNING, "not an index")
    try:
        with pytest.raises(ExecutionKeyError, match="holds a string"):
            checkpoint_now(
                store, eid, lease.generation, _doc(eid, 1), status="running", now_s=1700000001.0, after_running=True
            )
        assert json.loads(bclient.get(f"plaita:execution:{eid}"))["step"] == 0  # type: ignore[arg-type]
    finally:
        bclient.delete(RUNNING)
