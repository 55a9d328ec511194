"""Flows on real workers: kill -9 mid-step, start/resume exclusivity, bad input to the DLQ."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from plaita.flows import FlowRunner
from plaita.flows.producer.client import FlowClient
from plaita.store.client import make_client
from plaita.store.executions.store import ExecutionStore
from plaita.store.streams.queue import StreamQueue
from tests.flows import flowdefs
from tests.flows.support import dlq, ledgers
from tests.support.lease_workers import FAST_RECLAIM_ARGS, QUEUE, inproc_worker, settings, wait_for, worker_proc
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.redis

FLOW_ARGS = (
    "--flows", "tests.flows.flowdefs",
    *FAST_RECLAIM_ARGS,
)  # fmt: skip


def test_kill9_during_a_step_another_worker_finishes(redis_url: str, flows: FlowClient, tmp_path: Path) -> None:
    eid = flows.start("ledger3", {"sleep_step": "two", "sleep_s": 60})
    with worker_proc(redis_url, tmp_path, "fa", *FLOW_ARGS) as a:
        wait_for(lambda: flowdefs.client().get(f"plaita:test:sleeping:{eid}") == "two", 15, "step two running")
        a.kill9()
    with worker_proc(redis_url, tmp_path, "fb", *FLOW_ARGS) as b:
        doc = flows.wait(eid, 20)
        assert b.terminate() == 0
    assert doc["status"] == "completed" and doc["state"] == {"one": 1, "two": 2, "three": 3}
    # Step one ran exactly once; step two ran twice (killed, then again); staged writes once each.
    assert ledgers(eid, ["one", "two", "three"]) == [1, 2, 1]
    assert ledgers(eid, ["one", "two", "three"], "staged") == [1, 1, 1]


def test_start_and_resume_of_one_execution_never_overlap(redis_url: str, flows: FlowClient, tmp_path: Path) -> None:
    args = (*FLOW_ARGS, "--concurrency", "2")
    with worker_proc(redis_url, tmp_path, "oa", *args) as a, worker_proc(redis_url, tmp_path, "ob", *args) as b:
        a.wait_reading()
        b.wait_reading()
        eid = flows.start("overlap", {"hold_s": 0.8})
        # A start is recorded queued at once (issue 31, item 2): created means a worker took it over.
        wait_for(lambda: (flows.get(eid) or {}).get("status") == "running", 10, "execution created")
        flows.resume(eid, "event", {"n": 1})  # arrives while the start's step still runs
        doc = flows.wait(eid, 20)
    assert doc["status"] == "completed" and doc["state"]["data"] == {"n": 1}
    assert flowdefs.client().get(f"plaita:test:overlaps:{eid}") is None
    assert ledgers(eid, ["guarded"]) == [2]


def test_bad_input_goes_to_the_dlq_and_the_worker_lives(redis_url: str, flows: FlowClient) -> None:
    client = make_client(redis_url, socket_timeout_s=5.0)
    runner = FlowRunner(flowdefs.FLOWS, ExecutionStore(client))
    s = settings(redis_url, "dlq-w", eager_leases=True)
    try:
        with inproc_worker(s, runner):
            q = flows.queue
            q.enqueue({"type": "start", "flow_id": "no-such-flow", "params": {}})  # no execution_id
            q.enqueue({"type": "start", "flow_id": "ledger3", "execution_id": "p1", "params": "nope"})
            q.enqueue({"type": "resume", "execution_id": "ghost", "resume_type": "event"})
            bad = flows.start("bad_result")
            good = flows.start("ledger3")
            assert flows.wait(good, 10)["status"] == "completed"
            assert flows.wait(bad, 10)["status"] == "error"
            wait_for(lambda: len(dlq(client)) == 3, 10, "three dead letters")
    finally:
        runner.close()
        client.close()
    reasons = [str(d["reason"]) for d in dlq(client)]
    assert "unknown flow 'no-such-flow'" in reasons[0]
    assert "JSON object" in reasons[1] and "unknown execution" in reasons[2]


def test_keeper_recovers_an_execution_whose_task_was_dead_lettered(
    redis_url: str, flows: FlowClient, tmp_path: Path
) -> None:
    """kill -9 mid-step, then the task goes to the DLQ (as a task whose deliveries keep failing
    does; a kill -9 itself is no delivery since crash attribution): the execution is left running
    with no lease and no task; one keeper pass sends one retry that finishes it."""
    from tests.flows.test_cli import plaita

    eid = flows.start("ledger3", {"sleep_step": "two", "sleep_s": 60})
    with worker_proc(redis_url, tmp_path, "ka", *FLOW_ARGS) as a:
        wait_for(lambda: flowdefs.client().get(f"plaita:test:sleeping:{eid}") == "two", 15, "step two running")
        a.kill9()
    raw = make_client(redis_url, socket_timeout_s=5.0)
    try:
        ((mid, fields),) = raw.xrange(QUEUE)
        with raw.pipeline(transaction=True) as pipe:
            pipe.xadd(f"{QUEUE}:dlq", {"payload": fields[b"payload"], "reason": "max_deliveries"})
            pipe.xack(QUEUE, "plaita-workers", mid)
            pipe.xdel(QUEUE, mid)
            pipe.execute()
        wait_for(lambda: raw.exists(f"plaita:execution:lease:{eid}") == 0, 15, "the killed worker's lease gone")
        with worker_proc(redis_url, tmp_path, "kb", *FLOW_ARGS) as b:
            doc = flows.get(eid)
            assert doc is not None and doc["status"] == "running"
            for _ in range(2):  # the second pass is within the cooldown: no second retry
                r = plaita(redis_url, "keeper", "--once", "--orphan-grace-s", "0")
                assert r.returncode == 0, r.stderr
            doc = flows.wait(eid, 20)
            assert b.terminate() == 0
    finally:
        raw.close()
    assert doc["status"] == "completed"
    assert ledgers(eid, ["one", "two", "three"]) == [1, 2, 1]
    assert ledgers(eid, ["one", "two", "three"], "staged") == [1, 1, 1]
    # Worker b ran exactly one task to completion: the keeper's single retry.
    assert b.counters()["completed"] == 1 and b.counters()["dead_lettered"] == 0


def test_a_redis_freeze_mid_step_loses_nothing_and_commits_staged_writes_once(
    private_redis: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGSTOP Redis while step two runs, past the lease TTL: the worker rides it out, the
    execution completes, step one ran once and every staged write committed once."""
    url = private_redis.url
    monkeypatch.setenv("PLAITA_TEST_REDIS_URL", url)
    flowdefs._clients.clear()
    client = make_client(url, socket_timeout_s=5.0)
    queue = StreamQueue(client, stream=QUEUE, group="plaita-workers", consumer="p", dlq_key="", dlq_max_len=1)
    flows = FlowClient(queue)
    try:
        with worker_proc(url, tmp_path, "fz", *FLOW_ARGS) as w:
            w.wait_reading()
            eid = flows.start("ledger3", {"sleep_step": "two", "sleep_s": 2.0})
            wait_for(lambda: flowdefs.client().get(f"plaita:test:sleeping:{eid}") == "two", 15, "step two running")
            private_redis.freeze()
            time.sleep(3.0)  # longer than the 2 s lease TTL and the step
            private_redis.thaw()
            doc = flows.wait(eid, 30)
            assert w.alive()
    finally:
        if private_redis.frozen:
            private_redis.thaw()
        client.close()
        flowdefs._clients.clear()
    assert doc["status"] == "completed" and doc["state"]["three"] == 3
    one, two, three = ledgers(eid, ["one", "two", "three"])
    assert one == 1 and three == 1 and two in (1, 2)
    assert ledgers(eid, ["one", "two", "three"], "staged") == [1, 1, 1]
