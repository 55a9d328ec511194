"""Child executions on real workers: fan-out, the join, failures, cancel, kill -9, partitions."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from plaita.errors import LeaseLostError
from plaita.flows import FlowRunner
from plaita.flows.keeper.keeper import KeeperSettings
from plaita.flows.model.execution import Execution
from plaita.flows.producer.client import FlowClient
from plaita.ops.keeper_build import build_keeper
from plaita.store.client import make_client
from plaita.store.executions.execution_io import create_now
from plaita.store.executions.store import ExecutionStore
from plaita.store.leases import Lease, LeaseManager
from plaita.store.streams.partitioned import keyspace_of, open_queue
from plaita.tasks import Task
from tests.flows import fanout_flows, flowdefs
from tests.flows.support import ledgers
from tests.flows.test_workers import FLOW_ARGS
from tests.support.lease_workers import QUEUE, inproc_worker, settings, wait_for, worker_proc

pytestmark = pytest.mark.redis

ARGS = (*FLOW_ARGS, "--flows", "tests.flows.fanout_flows", "--concurrency", "4")


def kids(parent: str, n: int, k: int = 0) -> list[str]:
    return [f"{parent}:spread:{k}:{i}" for i in range(n)]


def joins(parent: str, tag: str = "") -> tuple[int, int]:
    """(direct runs of the join branch, staged joins committed) of ``parent`` (``tag``: its
    slot's hash tag with partitions, which a staged key carries)."""
    c = flowdefs.client()
    staged = f"plaita:test:joined:{parent}" + (f":{tag}" if tag else "")
    return int(c.get(f"plaita:test:joins:{parent}") or 0), int(c.get(staged) or 0)


def check_joined_in_order(
    doc: dict[str, Any], parent: str, n: int, failing: frozenset[int] = frozenset(), tag: str = ""
) -> None:
    outcomes = doc["state"]["outcomes"]
    assert [o[0] for o in outcomes] == kids(parent, n)
    for i, (_, status, result, error_type) in enumerate(outcomes):
        if i in failing:
            assert (status, result, error_type) == ("error", None, "NonRetryableError")
        else:
            assert (status, result, error_type) == ("completed", {"item": i, "x2": 2 * i}, None)
    assert doc["state"]["ok"] == n - len(failing)
    assert joins(parent, tag) == (1, 1)


@pytest.mark.parametrize("n", [10, 100])
def test_fan_out_joins_once_with_every_result_in_order(
    redis_url: str, flows: FlowClient, tmp_path: Path, n: int
) -> None:
    with worker_proc(redis_url, tmp_path, "fo", *ARGS) as w:
        parent = flows.start("fan", {"n": n})
        try:
            doc = flows.wait(parent, 60)
        except Exception:
            print(w.stderr()[-6000:])  # what the worker said, for the failure report
            raise
        assert w.terminate() == 0
    assert doc["status"] == "completed", doc
    check_joined_in_order(doc, parent, n)
    # Every child ran its step once and committed once; the spawning step spawned once.
    assert [flowdefs.ledger(k, "work", "staged") for k in kids(parent, n)] == [1] * n
    assert [flowdefs.ledger(k, "work") for k in kids(parent, n)] == [1] * n
    assert ledgers(parent, ["spread"], "staged") == [1]
    assert flows.get(kids(parent, n)[0])["parent"]["id"] == parent  # type: ignore[index]


def test_a_failing_child_is_visible_to_the_parent(redis_url: str, flows: FlowClient, tmp_path: Path) -> None:
    with worker_proc(redis_url, tmp_path, "ff", *ARGS) as w:
        parent = flows.start("fan", {"n": 5, "fail": [1, 3]})
        doc = flows.wait(parent, 60)
        assert w.terminate() == 0
    assert doc["status"] == "completed", doc
    check_joined_in_order(doc, parent, 5, frozenset({1, 3}))


def test_cancel_of_the_parent_cancels_its_children(redis_url: str, flows: FlowClient, tmp_path: Path) -> None:
    with worker_proc(redis_url, tmp_path, "fc", *ARGS) as w:
        parent = flows.start("fan", {"n": 6, "child": {"wait": True}})
        children = kids(parent, 6)

        def all_suspended() -> bool:
            return all((flows.get(k) or {}).get("status") == "suspended" for k in children)

        wait_for(all_suspended, 30, "every child suspended")
        assert flows.get(parent)["status"] == "suspended"  # type: ignore[index]
        flows.cancel(parent)
        assert flows.wait(parent, 20)["status"] == "cancelled"
        for k in children:
            assert flows.wait(k, 20)["status"] == "cancelled"
        assert w.terminate() == 0
    assert joins(parent) == (0, 0)


def test_cancel_of_a_suspended_parent_lands_at_once_though_its_children_fill_the_worker(
    redis_url: str, flows: FlowClient, tmp_path: Path
) -> None:
    """Issue 29, item 5: six children that hold their step until cancelled, a worker of two:
    the parent's cancel task queued behind their tasks waited for the children (60 s here), and
    the children then ended ``completed``. Now the cancel sets the children's flags itself: the
    two running ones stop at their checkpoint (their results discarded), the queued ones at their
    start (or, created ahead, at their checkpoint), and all end ``cancelled`` well within a lease
    TTL of 10 s."""
    with worker_proc(
        redis_url,
        tmp_path,
        "fcb",
        *FLOW_ARGS,
        "--flows",
        "tests.flows.fanout_flows",
        "--concurrency",
        "2",
        "--lease-ttl-seconds",
        "10",
    ) as w:
        parent = flows.start("fan", {"n": 6, "hold_first": list(range(6))})
        children = kids(parent, 6)
        wait_for(lambda: sum(flowdefs.ledger(k, "work") for k in children) == 2, 30, "two children in their step")
        done = flows.cancel(parent)
        assert (done.outcome, done.children) == ("suspended", 6)
        began = time.monotonic()
        assert flows.wait(parent, 10)["status"] == "cancelled"
        assert [flows.wait(k, 10)["status"] for k in children] == ["cancelled"] * 6
        took_s = time.monotonic() - began
        assert w.terminate() == 0
    assert took_s < 10, took_s
    assert [flowdefs.ledger(k, "work", "staged") for k in children] == [0] * 6  # no child result committed
    assert joins(parent) == (0, 0)


def test_a_redelivered_spawning_step_starts_no_second_set(redis_url: str, flows: FlowClient) -> None:
    """The spawning step runs, enqueues its children, and its worker dies before the checkpoint:
    the redelivered start runs the step again, which names the same children. Each child runs
    once; the parent joins once."""
    s = settings(redis_url, "redeliver", eager_leases=True)
    client = make_client(redis_url, socket_timeout_s=5.0)
    store = ExecutionStore(client, keyspace_of(s))
    runner = FlowRunner(fanout_flows.FLOWS, store)
    leases = LeaseManager(client, consumer="redeliver", ttl_s=30.0)
    parent = "p-redelivered"
    body = {"type": "start", "flow_id": "fan", "execution_id": parent, "params": {"n": 5}}
    real_write = runner._checkpoints.write
    crashes = []

    async def dies_at_the_suspension(io: Any, task: Task, document: str, **kw: Any) -> bool:
        if kw.get("status") == "suspended" and not crashes:
            crashes.append(1)
            raise LeaseLostError("the worker died here")
        return await real_write(io, task, document, **kw)

    runner._checkpoints.write = dies_at_the_suspension  # type: ignore[method-assign]
    try:
        for attempt in range(2):
            task = Task(f"{attempt + 1}-0", body, attempt + 1)
            lease = leases.acquire(parent)
            task.fencing_token = lease.generation  # type: ignore[union-attr]
            try:
                runner(task)
            except LeaseLostError:
                assert attempt == 0
            finally:
                leases.release(lease)  # type: ignore[arg-type]
    finally:
        runner.close()
    assert flows.get(parent)["status"] == "suspended"  # type: ignore[index]
    bodies = [json.loads(fields["payload"]) for _, fields in flowdefs.client().xrange(QUEUE)]
    child_starts = [b["execution_id"] for b in bodies if b.get("type") == "start" and b["flow_id"] == "kid"]
    assert len(child_starts) == 10 and sorted(set(child_starts)) == sorted(kids(parent, 5))  # one set of ids
    worker_runner = FlowRunner(fanout_flows.FLOWS, store)
    try:
        with inproc_worker(s, worker_runner):
            doc = flows.wait(parent, 30)
    finally:
        worker_runner.close()
        client.close()
    assert doc["status"] == "completed"
    check_joined_in_order(doc, parent, 5)
    assert [flowdefs.ledger(k, "work") for k in kids(parent, 5)] == [1] * 5
    assert ledgers(parent, ["spread"]) == [2] and ledgers(parent, ["spread"], "staged") == [1]


def test_kill9_of_two_workers_mid_fan_out_every_child_once_and_one_join(
    redis_url: str, flows: FlowClient, tmp_path: Path
) -> None:
    """100 children; two workers killed (-9) one after the other mid-run, a third finishes:
    every child's step committed exactly once, the parent spawned once and joined once."""
    n = 100
    parent = flows.start("fan", {"n": n, "child": {"sleep_s": 0.2}, "hold_first": [0]})
    children = kids(parent, n)
    held = children[0]  # its first run waits in the step until released: surely cut by a kill

    def done_at_least(count: int) -> bool:
        staged = flowdefs.client().mget([f"plaita:test:staged:{k}:work" for k in children])
        return sum(int(v or 0) for v in staged) >= count

    with worker_proc(redis_url, tmp_path, "ka", *ARGS) as a, worker_proc(redis_url, tmp_path, "kb", *ARGS) as b:
        wait_for(lambda: done_at_least(15) and flowdefs.ledger(held, "work") >= 1, 60, "15 done, one held")
        a.kill9()
        wait_for(lambda: done_at_least(40), 60, "40 children done")
        b.kill9()
    assert flows.get(parent)["status"] == "suspended"  # type: ignore[index]
    flowdefs.client().set(f"plaita:test:release:{held}", 1)
    with worker_proc(redis_url, tmp_path, "kc", *ARGS) as c:
        doc = flows.wait(parent, 120)
        assert c.terminate() == 0
    assert doc["status"] == "completed", doc
    check_joined_in_order(doc, parent, n)
    assert [flowdefs.ledger(k, "work", "staged") for k in children] == [1] * n  # exactly once per step
    runs = [flowdefs.ledger(k, "work") for k in children]
    assert max(runs) <= 3  # each of the two kills cut a child's run at most once
    assert runs[0] >= 2, "the held child was cut by a kill and ran again"
    assert ledgers(parent, ["spread"], "staged") == [1]


def test_fan_out_across_partitions(redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLAITA_TEST_REDIS_URL", redis_url)
    with FlowClient.from_url(redis_url, queue_name=QUEUE, partitions=4, socket_timeout_s=5.0) as flows:
        with worker_proc(redis_url, tmp_path, "fp", *ARGS, "--partitions", "4") as w:
            parent = flows.start("fan", {"n": 20})
            doc = flows.wait(parent, 60)
            assert w.terminate() == 0
        ks = flows.queue.keyspace
        homes = {ks.partition_of(k) for k in kids(parent, 20)}
        assert len(homes) == 4 and ks.partition_of(parent) in homes  # children on other partitions
        assert doc["status"] == "completed", doc
        check_joined_in_order(doc, parent, 20, tag=ks.slot_tag(parent))


def _run_task(runner: FlowRunner, leases: LeaseManager, body: dict[str, Any], message_id: str) -> None:
    task = Task(message_id, body, 1)
    lease = leases.acquire(task.execution_id)
    task.fencing_token = lease.generation  # type: ignore[union-attr]
    try:
        runner(task)
    finally:
        leases.release(lease)  # type: ignore[arg-type]


def test_a_child_killed_after_its_end_tells_its_parent_on_redelivery(redis_url: str, flows: FlowClient) -> None:
    """The last child's worker dies between its terminal checkpoint and the notification: the
    redelivered start (a no-op for the ended child) notifies the parent, which joins once."""
    s = settings(redis_url, "renotify", eager_leases=True)
    client = make_client(redis_url, socket_timeout_s=5.0)
    store = ExecutionStore(client, keyspace_of(s))
    runner = FlowRunner(fanout_flows.FLOWS, store)
    leases = LeaseManager(client, consumer="renotify", ttl_s=30.0)
    parent = "p-renotify"
    c0, c1 = kids(parent, 2)
    try:
        _run_task(
            runner, leases, {"type": "start", "flow_id": "fan", "execution_id": parent, "params": {"n": 2}}, "1-0"
        )
        starts = {b["execution_id"]: b for b in (json.loads(f["payload"]) for _, f in flowdefs.client().xrange(QUEUE))}
        _run_task(runner, leases, starts[c0], "2-0")
        real_ended = runner._children.ended
        runner._children.ended = lambda *a: (_ for _ in ()).throw(ConnectionError("killed"))  # type: ignore[method-assign]
        with pytest.raises(ConnectionError):
            _run_task(runner, leases, starts[c1], "3-0")
        runner._children.ended = real_ended  # type: ignore[method-assign]
        assert flows.get(c1)["status"] == "completed"  # type: ignore[index]
        flowdefs.client().delete(QUEUE)  # the parent's wake-up can only come from the redelivery
        _run_task(runner, leases, starts[c1], "3-0")  # redelivered: a no-op that notifies
        resumes = [json.loads(f["payload"]) for _, f in flowdefs.client().xrange(QUEUE)]
        assert [(r["execution_id"], r["resume_type"]) for r in resumes] == [(parent, "child")]
        done = f"plaita:execution:children:{parent}:spread:0"
        assert flowdefs.client().ttl(done) == -1  # no expiry while the parent waits
        _run_task(runner, leases, resumes[0], "4-0")
        _run_task(runner, leases, resumes[0], "4-0")  # the resume redelivered: a no-op
        assert flowdefs.client().get(done) == "joined" and flowdefs.client().ttl(done) > 0
        flowdefs.client().delete(QUEUE)
        _run_task(runner, leases, starts[c0], "5-0")  # a child's start redelivered after the join
        assert flowdefs.client().xlen(QUEUE) == 0  # wakes nobody
        assert flowdefs.client().get(done) == "joined"
    finally:
        runner.close()
        client.close()
    doc = flows.get(parent)
    assert doc is not None and doc["status"] == "completed"
    check_joined_in_order(doc, parent, 2)


def test_children_that_end_before_the_parent_suspends_are_joined_by_the_spawning_task(
    redis_url: str, flows: FlowClient
) -> None:
    """Both children run and end while the spawning task is still before its checkpoint (their
    wake-up would find the parent's lease taken): the task joins them right after suspending."""
    s = settings(redis_url, "early", eager_leases=True)
    client = make_client(redis_url, socket_timeout_s=5.0)
    store = ExecutionStore(client, keyspace_of(s))
    runner, other = FlowRunner(fanout_flows.FLOWS, store), FlowRunner(fanout_flows.FLOWS, store)
    leases = LeaseManager(client, consumer="early", ttl_s=30.0)
    parent = "p-early"
    real_write = runner._checkpoints.write

    async def children_first(io: Any, task: Task, document: str, **kw: Any) -> bool:
        if kw.get("status") == "suspended":
            bodies = [json.loads(f["payload"]) for _, f in flowdefs.client().xrange(QUEUE)]
            for i, b in enumerate(bodies):
                _run_task(other, leases, b, f"{10 + i}-0")
        return await real_write(io, task, document, **kw)

    runner._checkpoints.write = children_first  # type: ignore[method-assign]
    try:
        _run_task(
            runner, leases, {"type": "start", "flow_id": "fan", "execution_id": parent, "params": {"n": 2}}, "1-0"
        )
    finally:
        runner.close()
        other.close()
        client.close()
    doc = flows.get(parent)
    assert doc is not None and doc["status"] == "completed"  # joined within the spawning task
    check_joined_in_order(doc, parent, 2)


def test_a_parent_cancelled_while_it_spawns_cancels_the_children_it_started(redis_url: str, flows: FlowClient) -> None:
    s = settings(redis_url, "cancel-spawn", eager_leases=True)
    client = make_client(redis_url, socket_timeout_s=5.0)
    store = ExecutionStore(client, keyspace_of(s))
    runner = FlowRunner(fanout_flows.FLOWS, store)
    leases = LeaseManager(client, consumer="cancel-spawn", ttl_s=30.0)
    parent = "p-cancel-spawn"
    real_write = runner._checkpoints.write

    async def cancelled_meanwhile(io: Any, task: Task, document: str, **kw: Any) -> bool:
        if kw.get("status") == "suspended":
            store.request_cancel(parent)  # `plaita executions cancel` while the step ran
        return await real_write(io, task, document, **kw)

    runner._checkpoints.write = cancelled_meanwhile  # type: ignore[method-assign]
    try:
        _run_task(
            runner, leases, {"type": "start", "flow_id": "fan", "execution_id": parent, "params": {"n": 3}}, "1-0"
        )
        assert flows.get(parent)["status"] == "cancelled"  # type: ignore[index]
        runner._checkpoints.write = real_write  # type: ignore[method-assign]
        starts = [json.loads(f["payload"]) for _, f in flowdefs.client().xrange(QUEUE)]
        assert sorted(b["execution_id"] for b in starts) == kids(parent, 3)
        for i, b in enumerate(starts):
            _run_task(runner, leases, b, f"{2 + i}-0")
    finally:
        runner.close()
        client.close()
    assert [flows.get(k)["status"] for k in kids(parent, 3)] == ["cancelled"] * 3  # type: ignore[index]
    assert [flowdefs.ledger(k, "work") for k in kids(parent, 3)] == [0] * 3  # never ran their step


def test_a_child_the_keeper_marks_orphaned_wakes_its_parent(redis_url: str, flows: FlowClient) -> None:
    """A child whose worker is gone for good is ended ``error`` (Orphaned) by the keeper; the task
    enqueued with that marking tells the parent, which joins and sees the Orphaned outcome."""
    s = settings(redis_url, "orphan-kid", eager_leases=True)
    client = make_client(redis_url, socket_timeout_s=5.0)
    store = ExecutionStore(client, keyspace_of(s))
    runner = FlowRunner(fanout_flows.FLOWS, store)
    leases = LeaseManager(client, consumer="orphan-kid", ttl_s=30.0)
    parent = "p-orphan-kid"
    c0, c1 = kids(parent, 2)
    try:
        _run_task(
            runner, leases, {"type": "start", "flow_id": "fan", "execution_id": parent, "params": {"n": 2}}, "1-0"
        )
        starts = {b["execution_id"]: b for b in (json.loads(f["payload"]) for _, f in flowdefs.client().xrange(QUEUE))}
        _run_task(runner, leases, starts[c0], "2-0")
        # c1 was created and its worker died before its first step; its task is gone.
        lease = leases.acquire(c1)
        assert isinstance(lease, Lease)
        kid = Execution.start(c1, runner.flows.get("kid"), starts[c1]["params"], dedup_key=None, now_s=time.time())  # type: ignore[arg-type]
        kid = replace(kid, extra={"parent": starts[c1]["parent"]})
        assert create_now(store, c1, lease.generation, kid.encode(), kid.created_at, None)[0] == 1
        leases.release(lease)
        flowdefs.client().delete(QUEUE)
        keeper = build_keeper(
            store,
            open_queue(s, client=client),
            KeeperSettings(interval_s=0.1, orphan_grace_s=0, lease_ttl_s=2, zombie_after_s=60),
            clock=lambda: time.time() + 120,
        )
        assert keeper.run_once().orphaned == [c1]
        [notice] = [json.loads(f["payload"]) for _, f in flowdefs.client().xrange(QUEUE)]
        assert (notice["execution_id"], notice["resume_type"]) == (c1, "continue")
        flowdefs.client().delete(QUEUE)
        _run_task(runner, leases, notice, "3-0")  # a no-op for the ended child: it tells the parent
        [wake] = [json.loads(f["payload"]) for _, f in flowdefs.client().xrange(QUEUE)]
        assert (wake["execution_id"], wake["resume_type"]) == (parent, "child")
        _run_task(runner, leases, wake, "4-0")
    finally:
        runner.close()
        client.close()
    doc = flows.get(parent)
    assert doc is not None and doc["status"] == "completed", doc
    outcomes = doc["state"]["outcomes"]
    assert [o[:2] for o in outcomes] == [[c0, "completed"], [c1, "error"]]
    assert outcomes[1][3] == "Orphaned"


def test_a_second_spawn_of_one_step_gets_new_children_never_the_first_rounds(redis_url: str, flows: FlowClient) -> None:
    """Guards issue 31: a step that spawns again after its first join names a new set of
    children (``{parent}:{step}:1:*``: the step's join count moved on). The bug put in by hand
    (the join count not moved on in ``Children._joined``) made the second spawn name the first
    round's children, all ended: it joined at once with their outcomes and never started the
    second round."""
    s = settings(redis_url, "rounds")
    client = make_client(redis_url, socket_timeout_s=5.0)
    runner = FlowRunner(fanout_flows.FLOWS, ExecutionStore(client, keyspace_of(s)))
    parent = flows.start("rounds", {})
    try:
        with inproc_worker(s, runner):
            doc = flows.wait(parent, 30)
    finally:
        runner.close()
        client.close()
    assert doc["status"] == "completed", doc
    second = [f"{parent}:twice:1:{i}" for i in range(2)]
    assert doc["state"]["seen"] == [[second[0], 10], [second[1], 11]]
    for eid in [f"{parent}:twice:0:{i}" for i in range(2)] + second:
        child = flows.get(eid)
        assert child is not None and child["status"] == "completed", (eid, child)
        assert flowdefs.ledger(eid, "work") == 1
    assert flowdefs.client().get(f"plaita:test:rounds:{parent}") == "2"  # two joins, once each
