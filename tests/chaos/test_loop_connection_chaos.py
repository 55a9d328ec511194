"""Chaos tier for the flow runner's loop connection (``plaita.store.executions.loop_calls``): a flow
worker (``--flows tests.chaos.loopflows``: ``async def`` and sync steps) with executions in
flight rides out a SIGSTOP past its socket timeout, kill -9 of Redis with a restart (with its
data: the scripts are gone, NOSCRIPT), a blackhole and connection resets through the proxy.
Every execution ends completed, every step's staged write is committed exactly once (no
checkpoint applied twice, none lost), and the worker never exits."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from plaita.flows.producer.client import FlowClient
from plaita.store.client import make_client
from plaita.store.streams.queue import StreamQueue
from tests.chaos.loopflows import STEPS
from tests.support.lease_workers import FAST_RECLAIM_ARGS, QUEUE, WorkerProc, wait_for, worker_proc
from tests.support.proxy import FaultProxy
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.chaos

EXECUTIONS = 16
CONCURRENCY = 4
FAULT_S = 4.0  # longer than the worker's socket timeout (read block 0.2 s + 1.5 s) and its lease TTL
FLOW_ARGS = (
    "--flows", "tests.chaos.loopflows",
    "--concurrency", str(CONCURRENCY),
    *FAST_RECLAIM_ARGS,
)  # fmt: skip


@pytest.fixture
def flows(private_redis: RedisServer) -> Iterator[FlowClient]:
    """A producer straight on the server (never through the proxy)."""
    client = make_client(private_redis.url, socket_timeout_s=5.0)
    queue = StreamQueue(client, stream=QUEUE, group="plaita-workers", consumer="p", dlq_key="", dlq_max_len=1)
    yield FlowClient(queue)
    client.close()


def staged_counts(server: RedisServer, eid: str) -> list[int]:
    admin = server.client(decode_responses=True)
    try:
        return [int(admin.get(f"plaita:test:staged:{eid}:{s}") or 0) for s in STEPS]
    finally:
        admin.close()


def ride_out(
    server: RedisServer,
    flows: FlowClient,
    tmp_path: Path,
    url: str,
    fault: Callable[[], None],
    heal: Callable[[], None],
) -> WorkerProc:
    """Start executions, strike with ``fault`` once some have checkpointed and others have not,
    ``heal`` after FAULT_S, then check every execution; returns the (still running) worker."""
    with worker_proc(url, tmp_path, "loopchaos", *FLOW_ARGS) as w:
        w.wait_reading()
        eids = [flows.start("relay", {"pause_s": 0.15}) for _ in range(EXECUTIONS)]
        wait_for(lambda: sum(staged_counts(server, eids[0])) >= 2, 20, "executions checkpointing")
        fault()
        try:
            time.sleep(FAULT_S)  # the outage's length, not a synchronisation
            assert w.alive(), w.stderr()[-3000:]
        finally:
            heal()
        docs = {eid: flows.wait(eid, 90) for eid in eids}
        assert w.alive(), w.stderr()[-3000:]
        for eid, doc in docs.items():
            assert doc["status"] == "completed", (eid, doc)
            assert staged_counts(server, eid) == [1] * len(STEPS), (eid, staged_counts(server, eid))
        assert w.terminate() == 0, w.stderr()[-3000:]
        return w


def test_flow_worker_rides_out_a_freeze_past_its_socket_timeout(
    private_redis: RedisServer, flows: FlowClient, tmp_path: Path
) -> None:
    def thaw() -> None:
        if private_redis.frozen:
            private_redis.thaw()

    ride_out(private_redis, flows, tmp_path, private_redis.url, private_redis.freeze, thaw)


def test_flow_worker_rides_out_kill9_and_a_restart_with_its_data(
    private_redis: RedisServer, flows: FlowClient, tmp_path: Path
) -> None:
    """The AOF (appendfsync always) keeps every acknowledged checkpoint; the script cache is
    empty after the restart, so the loop connection meets NOSCRIPT."""

    def restart() -> None:
        if private_redis.proc is None:
            private_redis.start()

    ride_out(private_redis, flows, tmp_path, private_redis.url, private_redis.kill, restart)


def test_flow_worker_rides_out_a_blackhole(private_redis: RedisServer, flows: FlowClient, tmp_path: Path) -> None:
    with FaultProxy(private_redis.port) as proxy:
        ride_out(private_redis, flows, tmp_path, proxy.url, proxy.blackhole, proxy.restore)


def test_flow_worker_rides_out_connection_resets(private_redis: RedisServer, flows: FlowClient, tmp_path: Path) -> None:
    with FaultProxy(private_redis.port) as proxy:

        def resets() -> None:
            assert proxy.reset_all() >= 1

        ride_out(private_redis, flows, tmp_path, proxy.url, resets, lambda: None)


def test_flow_worker_rides_out_a_restart_without_its_data(
    private_redis: RedisServer, flows: FlowClient, tmp_path: Path
) -> None:
    """The executions in flight are gone with the data: none is brought back half-done by a
    late checkpoint (each is gone, or whole); executions started afterwards complete, each
    step's staged write committed once, and the worker never exits."""
    with worker_proc(private_redis.url, tmp_path, "loopwipe", *FLOW_ARGS) as w:
        w.wait_reading()
        lost = [flows.start("relay", {"pause_s": 0.15}) for _ in range(EXECUTIONS)]
        wait_for(lambda: sum(staged_counts(private_redis, lost[0])) >= 2, 20, "executions checkpointing")
        private_redis.restart(keep_data=False)
        assert w.alive(), w.stderr()[-3000:]
        after = [flows.start("relay", {"pause_s": 0.05}) for _ in range(CONCURRENCY * 2)]
        docs = {eid: flows.wait(eid, 90) for eid in after}
        assert all(d["status"] == "completed" for d in docs.values()), docs
        assert all(staged_counts(private_redis, eid) == [1] * len(STEPS) for eid in after)
        for eid in lost:  # a checkpoint fenced by a lease the wipe took must not recreate it
            counts = staged_counts(private_redis, eid)
            assert flows.get(eid) is None or counts == [1] * len(STEPS), (eid, flows.get(eid), counts)
            assert max(counts) <= 1, (eid, counts)
        assert w.alive(), w.stderr()[-3000:]
        assert w.terminate() == 0, w.stderr()[-3000:]
