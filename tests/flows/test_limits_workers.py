"""Fleet-wide flow limits on real worker processes: the limit holds across workers, a killed
worker's slot comes back within the lease TTL, the start rate holds, and waiting tasks are
neither dead-lettered nor charged a delivery."""

from __future__ import annotations

import time
from contextlib import ExitStack
from pathlib import Path

import pytest

from plaita.flows.producer.client import FlowClient
from plaita.store.client import make_client
from plaita.store.executions.flow_limits import FlowLimitStore, limit_keys
from plaita.store.keyspace import Keyspace
from plaita.store.streams.queue import StreamQueue
from tests.flows import flowdefs
from tests.flows.limitdefs import gate_key, max_key, order_key, running_key, starts_key
from tests.flows.support import dlq, ledgers
from tests.support.lease_workers import QUEUE, WorkerProc, wait_for, worker_proc
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.redis


def args(lease_ttl_s: int, claim_min_idle_ms: int, *extra: str) -> tuple[str, ...]:
    return (
        "--flows", "tests.flows.limitdefs",
        "--lease-ttl-seconds", str(lease_ttl_s),
        "--claim-min-idle-ms", str(claim_min_idle_ms),
        "--reclaim-interval-s", "0.3",
        "--read-block-ms", "200",
        "--concurrency", "3",
        *extra,
    )  # fmt: skip


def workers(stack: ExitStack, url: str, tmp_path: Path, n: int, *argv: str) -> list[WorkerProc]:
    procs = [stack.enter_context(worker_proc(url, tmp_path, f"lim{i}", *argv)) for i in range(n)]
    for p in procs:
        p.wait_reading(60.0)  # a loaded machine starts four interpreters slowly
    return procs


def handed_back(procs: list[WorkerProc]) -> int:
    return sum(p.counters().get("handed_back", 0) for p in procs)


def parked(flow_id: str) -> int:
    return FlowLimitStore(flowdefs.client(), Keyspace(QUEUE)).waiting(flow_id)


def test_max_concurrent_holds_across_four_workers(redis_url: str, flows: FlowClient, tmp_path: Path) -> None:
    """Four workers of three handler threads each, a flow of two slots: never more than two run;
    the rest wait parked, without a delivery charged (``--max-deliveries 1`` would dead-letter a
    task delivered twice), and every execution completes once."""
    with ExitStack() as stack:
        procs = workers(stack, redis_url, tmp_path, 4, *args(5, 5000, "--max-deliveries", "1"))
        eids = [flows.start("pair", {"hold_s": 0.3}) for _ in range(10)]
        wait_for(lambda: parked("pair") > 0, 60, "starts parked for a slot")
        docs = [flows.wait(eid, 60) for eid in eids]
        assert all(p.terminate() == 0 for p in procs)
    assert [d["status"] for d in docs] == ["completed"] * 10
    c = flowdefs.client()
    assert 1 <= int(c.get(max_key("pair")) or 0) <= 2
    assert int(c.get(running_key("pair")) or 0) == 0
    assert [ledgers(eid, ["hold"]) for eid in eids] == [[1]] * 10  # no step ran twice
    assert parked("pair") == 0
    assert dlq(c) == []


def test_waiting_starts_run_in_start_order_and_are_not_re_read(
    redis_url: str, flows: FlowClient, tmp_path: Path
) -> None:
    """Issue 31 item 4, on two worker processes: while a one-slot flow is busy, 8 starts wait
    parked (none handed back to be re-read; before the fix a worker re-read waiting tasks about
    3 times per start), and once the slot frees they run in the order they were started. Each
    start is read at most twice: when it parked and when its turn came."""
    c = flowdefs.client()
    with ExitStack() as stack:
        procs = workers(stack, redis_url, tmp_path, 2, *args(5, 5000, "--max-deliveries", "1"))
        blocker = flows.start("ordered", {"gate": True})
        wait_for(lambda: c.lrange(order_key("ordered"), 0, -1) == [blocker], 60, "the blocker holds the slot")
        eids = [flows.start("ordered") for _ in range(8)]
        wait_for(lambda: parked("ordered") == 8, 60, "every start parked")
        c.set(gate_key("ordered"), "1")
        docs = [flows.wait(eid, 60) for eid in [blocker, *eids]]
        reads = sum(p.counters().get("completed", 0) for p in procs)
        waits = handed_back(procs)
        assert all(p.terminate() == 0 for p in procs)
    assert [d["status"] for d in docs] == ["completed"] * 9
    assert c.lrange(order_key("ordered"), 0, -1) == [blocker, *eids]
    assert waits == 0
    assert reads <= 1 + 2 * len(eids)
    assert parked("ordered") == 0 and dlq(c) == []


def test_a_killed_workers_slot_comes_back_within_the_lease_ttl(
    redis_url: str, flows: FlowClient, tmp_path: Path
) -> None:
    """A one-slot flow whose slot is held by a worker killed with -9: the slot expires within
    the lease TTL (its expiry is at most one TTL after its last renewal), and another worker
    runs the victim again and every execution that waited behind it."""
    argv = args(2, 500)
    with ExitStack() as stack:
        (a,) = workers(stack, redis_url, tmp_path, 1, *argv)
        victim = flows.start("solo", {"block_first": True})
        wait_for(lambda: flowdefs.client().get(f"plaita:test:blocked:{victim}") == "1", 60, "the victim's step")
        waiting = [flows.start("solo", {"hold_s": 0.1}) for _ in range(3)]
        b = stack.enter_context(worker_proc(redis_url, tmp_path, "limb", *argv))
        b.wait_reading(60.0)
        client = make_client(redis_url, socket_timeout_s=5.0)
        slots, _, _ = limit_keys(Keyspace(QUEUE), "solo")
        expiry_ms = float(client.zscore(slots, victim) or 0)
        now_s, micros = client.time()
        a.kill9()
        assert expiry_ms > 0 and expiry_ms - (now_s * 1000 + micros // 1000) <= 2000  # within one lease TTL
        docs = [flows.wait(eid, 60) for eid in [victim, *waiting]]
        assert b.terminate() == 0
        client.close()
    assert [d["status"] for d in docs] == ["completed"] * 4
    assert ledgers(victim, ["hold"]) == [2]  # killed once, then run again
    assert [ledgers(eid, ["hold"]) for eid in waiting] == [[1]] * 3
    c = flowdefs.client()
    assert int(c.get(max_key("solo")) or 0) == 1
    assert dlq(c) == []


def test_the_start_rate_holds_across_workers(redis_url: str, flows: FlowClient, tmp_path: Path) -> None:
    """16 starts of a flow limited to 4 starts/s (bucket of 4) on two workers: the last start
    comes at least (16 - 4) / 4 = 3 s after the first (less 1.5 s for the time a step takes to
    record its start on a loaded machine; slowness only widens the gap), none is dead-lettered."""
    with ExitStack() as stack:
        procs = workers(stack, redis_url, tmp_path, 2, *args(5, 5000, "--max-deliveries", "1"))
        eids = [flows.start("paced") for _ in range(16)]
        docs = [flows.wait(eid, 60) for eid in eids]
        assert all(p.terminate() == 0 for p in procs)
    assert [d["status"] for d in docs] == ["completed"] * 16
    c = flowdefs.client()
    starts = sorted(float(t) for t in c.lrange(starts_key("paced"), 0, -1))  # type: ignore[union-attr]
    assert len(starts) == 16
    assert starts[-1] - starts[0] >= 3.0 - 1.5
    assert dlq(c) == []


def test_a_redis_freeze_and_restart_lose_no_waiting_task(
    private_redis: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Redis frozen past the lease TTL, then killed and restarted (with its data), while
    executions of a two-slot flow run and wait: both workers ride it out (BACKOFF, no exit),
    and every execution completes, none dead-lettered."""
    url = private_redis.url
    monkeypatch.setenv("PLAITA_TEST_REDIS_URL", url)
    flowdefs._clients.clear()
    client = make_client(url, socket_timeout_s=5.0)
    flows = FlowClient(
        StreamQueue(client, stream=QUEUE, group="plaita-workers", consumer="p", dlq_key="", dlq_max_len=10)
    )
    try:
        with ExitStack() as stack:
            procs = workers(stack, url, tmp_path, 2, *args(2, 500))
            eids = [flows.start("pair", {"hold_s": 0.5}) for _ in range(12)]
            wait_for(lambda: parked("pair") > 0, 60, "starts parked for a slot")
            private_redis.freeze()
            time.sleep(3.0)  # the fault's length: longer than the 2 s lease TTL
            private_redis.thaw()
            private_redis.restart()
            docs = [flows.wait(eid, 60) for eid in eids]
            assert all(p.alive() for p in procs)
            assert all(p.terminate() == 0 for p in procs)
    finally:
        if private_redis.frozen:
            private_redis.thaw()
        client.close()
        flowdefs._clients.clear()
    assert [d["status"] for d in docs] == ["completed"] * 12
    assert dlq(private_redis.client()) == []
