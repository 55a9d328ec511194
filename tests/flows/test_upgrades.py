"""Issue 18, reproductions 7 and 10: rolling upgrades and services sharing a queue.

Real ``plaita worker --flows`` processes on a private redis-server. The rule under test
(docs/flows.md, "Versions and rolling upgrades"): an execution is never ended because of which
worker picked its task up; a worker that cannot run it hands it back, without charging a
delivery, for a live worker that can.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from plaita.flows.producer.client import FlowClient
from tests.flows import flowdefs
from tests.flows.support import dlq
from tests.support.lease_workers import wait_for, worker_proc

pytestmark = pytest.mark.redis

ARGS = (
    "--claim-min-idle-ms", "2000",
    "--reclaim-interval-s", "1",
    "--lease-ttl-s", "5",
    "--read-block-ms", "200",
    "--prefetch", "0",
)  # fmt: skip
V1 = ("--flows", "tests.flows.fleet_v1", *ARGS)
V2 = ("--flows", "tests.flows.fleet_v2", *ARGS)


def steps_log(eid: str) -> list[str]:
    return list(flowdefs.client().lrange(f"plaita:test:up:{eid}", 0, -1))  # type: ignore[arg-type]


def status_of(flows: FlowClient, eid: str) -> str | None:
    doc = flows.get(eid)
    return None if doc is None else str(doc.get("status"))


def test_rolling_upgrade_an_old_worker_hands_an_upgraded_execution_back(
    redis_url: str, flows: FlowClient, tmp_path: Path
) -> None:
    """Reproduction 7: started on v1, resumed once on v2 (which upgrades it: v2 declares v1
    compatible), then a v1 worker still in the fleet got its next resume and ended it in `error`
    ("changed since this execution started ... '2' -> '1'"). Now v1 hands it back and v2 ends it."""
    with worker_proc(redis_url, tmp_path, "v1a", *V1, "--max-deliveries", "3") as v1:
        v1.wait_reading()
        eid = flows.start("up")
        wait_for(lambda: status_of(flows, eid) == "suspended", 15, "the execution suspended on v1")
        assert v1.terminate() == 0
    with worker_proc(redis_url, tmp_path, "v2a", *V2, "--max-deliveries", "3") as v2:
        v2.wait_reading()
        flows.resume(eid, "event", "one")
        wait_for(lambda: (flows.get(eid) or {}).get("step") == "wait2", 15, "wait1 resumed on v2")
        doc = flows.get(eid)
        assert doc is not None and doc["version"] == "2" and doc["versions"] == ["1", "2"]
        with worker_proc(redis_url, tmp_path, "v1b", *V1, "--max-deliveries", "3") as v1b:
            v1b.wait_reading()
            # Keep v2's only slot busy, so the v1 worker is the one that reads the next resume.
            busy = flows.start("busy_v2", {"s": 2.0})
            wait_for(lambda: flowdefs.client().get(f"plaita:test:busy:{busy}") is not None, 15, "v2 busy")
            flows.resume(eid, "event", "two")
            doc = flows.wait(eid, 30)
            assert doc["status"] == "completed", doc.get("error")
            wait_for(lambda: v1b.counters().get("handed_back", 0) >= 1, 10, "v1's hand-back counted")
            assert v1b.terminate() == 0
        assert v2.terminate() == 0
    assert doc["status"] == "completed", doc.get("error")
    assert steps_log(eid) == ["wait1@v2", "wait2@v2", "extra@v2"]
    assert doc["state"] == {"wait1": "one", "wait2": "two", "extra": True}
    assert "handed back" in v1b.stderr() and "Traceback" not in v1b.stderr()
    assert dlq(flowdefs.client()) == []


def test_services_with_different_flow_modules_leave_each_other_their_starts(
    redis_url: str, flows: FlowClient, tmp_path: Path
) -> None:
    """Reproduction 10: two services with different flow modules on one queue dead-lettered each
    other's starts as "unknown flow". Now each start reaches the worker that loads its flow, and
    a hand-back charges no delivery: with --max-deliveries 1 a charged one would be dead-lettered."""
    one = ("--max-deliveries", "1")
    with worker_proc(redis_url, tmp_path, "sa", *V1, *one) as a, worker_proc(redis_url, tmp_path, "sb", *V2, *one) as b:
        a.wait_reading()
        b.wait_reading()
        wait_for(lambda: len(flowdefs.client().keys("plaita:registry:flow_worker:*")) == 2, 15, "both registered")
        ids = [flows.start("only_v1") for _ in range(6)] + [flows.start("only_v2") for _ in range(6)]
        docs = [flows.wait(eid, 30) for eid in ids]
        # Half the starts are for the other service: some are read by the wrong worker first.
        handed = lambda: a.counters().get("handed_back", 0) + b.counters().get("handed_back", 0)  # noqa: E731
        wait_for(lambda: handed() >= 1, 10, "a start handed back to the other service")
        assert a.terminate() == 0 and b.terminate() == 0
    assert [d["status"] for d in docs] == ["completed"] * 12, [d.get("error") for d in docs]
    assert [d["state"]["by"] for d in docs] == ["v1"] * 6 + ["v2"] * 6
    c = flowdefs.client()
    assert [int(c.get(f"plaita:test:only_v1:{e}") or 0) for e in ids[:6]] == [1] * 6  # type: ignore[arg-type]
    assert [int(c.get(f"plaita:test:only_v2:{e}") or 0) for e in ids[6:]] == [1] * 6  # type: ignore[arg-type]
    assert dlq(c) == []


def test_an_old_worker_alone_never_ends_an_upgraded_execution(
    redis_url: str, flows: FlowClient, tmp_path: Path
) -> None:
    """Rolled back to v1 only: the upgraded execution's resume is left pending (then dead-lettered
    after --max-deliveries), the execution stays suspended; with a v2 worker back, `dlq requeue`
    finishes it."""
    with worker_proc(redis_url, tmp_path, "v2x", *V2, "--max-deliveries", "2") as v2:
        v2.wait_reading()
        eid = flows.start("up")
        wait_for(lambda: status_of(flows, eid) == "suspended", 15, "suspended on v2")
        assert v2.terminate() == 0
    with worker_proc(redis_url, tmp_path, "v1x", *V1, "--max-deliveries", "2") as v1:
        v1.wait_reading()
        flows.resume(eid, "event", "one")
        wait_for(lambda: len(dlq(flowdefs.client())) == 1, 20, "the resume dead-lettered, not applied")
        assert v1.terminate() == 0
    doc = flows.get(eid)
    assert doc is not None and doc["status"] == "suspended" and doc["step"] == "wait1" and doc["error"] is None
    [letter] = dlq(flowdefs.client())
    assert "this worker runs version '1'" in str(letter["reason"]) and "no live worker runs it" in str(letter["reason"])
    assert "which is older, and no live worker runs it" in v1.stderr() and "Traceback" not in v1.stderr()
    from tests.flows.test_cli import plaita

    with worker_proc(redis_url, tmp_path, "v2y", *V2) as v2:
        v2.wait_reading()
        assert plaita(redis_url, "dlq", "requeue", "--all").returncode == 0
        wait_for(lambda: (flows.get(eid) or {}).get("step") == "wait2", 20, "the requeued resume applied on v2")
        assert v2.terminate() == 0


def test_a_start_asking_for_a_version_this_worker_does_not_run_goes_to_one_that_does(
    redis_url: str, flows: FlowClient, tmp_path: Path
) -> None:
    """`executions start --version 2` read by a v1 worker was dead-lettered ("version '2'
    requested; loaded is '1'") although a v2 worker was live; now it is handed to that worker."""
    with worker_proc(redis_url, tmp_path, "rv2", *V2) as v2, worker_proc(redis_url, tmp_path, "rv1", *V1) as v1:
        v2.wait_reading()
        v1.wait_reading()
        busy = flows.start("busy_v2", {"s": 2.0})  # v2's only slot: v1 reads the start
        wait_for(lambda: flowdefs.client().get(f"plaita:test:busy:{busy}") is not None, 15, "v2 busy")
        eid = flows.start("up", version="2")
        wait_for(lambda: status_of(flows, eid) == "suspended", 20, "started on v2")
        assert v1.terminate() == 0 and v2.terminate() == 0
    doc = flows.get(eid)
    assert doc is not None and doc["version"] == "2" and dlq(flowdefs.client()) == []
    assert "version '2' is not run here" in v1.stderr()


def test_a_start_for_a_version_no_live_worker_runs_waits_for_a_worker_that_runs_it(
    redis_url: str, flows: FlowClient, tmp_path: Path
) -> None:
    """Issue 31, item 3: deploy order loses no work. Before: the v1 worker dead-lettered the start
    at once ("version '2' requested; loaded is '1'") and the v2 worker started after never ran it.
    Now it waits, handed back and shown as waiting for version 2, until v2 registers."""
    with worker_proc(redis_url, tmp_path, "wv1", *V1, "--version-wait-s", "60") as v1:
        v1.wait_reading()
        eid = flows.start("up", version="2")
        wait_for(lambda: "waiting" in (flows.get(eid) or {}), 15, "the start shown waiting for version 2")
        doc = flows.get(eid)
        assert doc is not None and doc["status"] == "queued" and doc["waiting"]["version"] == "2"
        assert dlq(flowdefs.client()) == []
        with worker_proc(redis_url, tmp_path, "wv2", *V2) as v2:
            v2.wait_reading()
            wait_for(lambda: status_of(flows, eid) == "suspended", 20, "started on v2 once it registered")
            assert v2.terminate() == 0
        assert v1.terminate() == 0
    doc = flows.get(eid)
    assert doc is not None and doc["version"] == "2" and "waiting" not in doc and dlq(flowdefs.client()) == []
