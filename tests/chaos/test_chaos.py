"""Chaos tier: a subprocess worker against a private redis-server that is faulted for real.

Faults: SIGSTOP/SIGCONT (timeouts), kill -9 + restart with and without its data, and a TCP
proxy between worker and Redis that blackholes or resets connections. Every test asserts that
the worker process survives, that every task still in Redis completes (duplicates bounded by
what was in flight), that each outage is logged exactly once ("Redis unavailable" warning,
then "Redis is back"), and that SIGTERM afterwards exits 0. Tasks are enqueued by a direct
client, never through the proxy.
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from plaita.ops.status import read_status_file
from plaita.store.streams.queue import StreamQueue
from tests.support.handlers import read_log
from tests.support.proxy import FaultProxy
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.chaos

ROOT = Path(__file__).resolve().parents[2]
STREAM = "plaita:flow:queue"
GROUP = "plaita-workers"
CONCURRENCY = 2
PREFETCH = 2
#: Most tasks a worker holds at once: the bound on duplicates an outage may cause.
IN_FLIGHT_MAX = CONCURRENCY + PREFETCH
CLAIM_MIN_IDLE_MS = 3000
POLL_S = 0.02
UNAVAILABLE = "Redis unavailable"
BACK = "Redis is back"


class WorkerProcess:
    """``python -m plaita worker`` in a subprocess, observed through its status file, task log and stderr."""

    def __init__(self, redis_url: str, workdir: Path) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.task_log = workdir / "tasks.log"
        self.status_file = workdir / "status.json"
        self.stderr_file = workdir / "worker.stderr"
        args = [
            sys.executable, "-m", "plaita", "worker",
            "--redis-url", redis_url,
            "--handler", "tests.support.handlers:record",
            "--status-file", str(self.status_file),
            "--consumer-name", "chaos:0",
            "--concurrency", str(CONCURRENCY),
            "--prefetch", str(PREFETCH),
            "--read-block-ms", "200",
            "--reclaim-interval-s", "1",
            "--claim-min-idle-ms", str(CLAIM_MIN_IDLE_MS),
            "--drain-timeout-s", "5",
        ]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith("PLAITA_")}
        env.update(PYTHONPATH=str(ROOT), PLAITA_TEST_LOG=str(self.task_log))
        with open(self.stderr_file, "wb") as err:
            self.proc = subprocess.Popen(args, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)

    # -- observation ------------------------------------------------------------------
    def status(self) -> dict[str, Any] | None:
        return read_status_file(self.status_file)

    def state(self) -> str | None:
        st = self.status()
        return None if st is None else str(st.get("state"))

    def stderr(self) -> str:
        try:
            return self.stderr_file.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def outage_lines(self) -> list[str]:
        """The "unavailable" and "back" log lines, in order."""
        return [ln for ln in self.stderr().splitlines() if UNAVAILABLE in ln or BACK in ln]

    def done_counts(self) -> collections.Counter[str]:
        """How many times each task number completed."""
        return collections.Counter(n for event, _mid, n, _d in read_log(str(self.task_log)) if event == "done")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_for(self, what: str, predicate: Callable[[], bool], timeout_s: float) -> None:
        """Poll ``predicate`` until true; fail (with the worker's stderr tail) at the deadline or if it died."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if predicate():
                return
            if not self.alive():
                pytest.fail(f"worker exited ({self.proc.returncode}) while waiting for {what}\n{self.tail()}")
            time.sleep(POLL_S)
        pytest.fail(f"timed out after {timeout_s} s waiting for {what}; status={self.status()}\n{self.tail()}")

    def wait_state(self, state: str, timeout_s: float = 10.0) -> None:
        self.wait_for(f"state {state}", lambda: self.state() == state, timeout_s)

    def watch_states(self, duration_s: float) -> set[str]:
        """Every state the status file shows during ``duration_s`` (the fault's length); fails if the worker dies."""
        seen: set[str] = set()
        end = time.monotonic() + duration_s
        while time.monotonic() < end:
            assert self.alive(), f"worker died during the fault\n{self.tail()}"
            state = self.state()
            if state is not None:
                seen.add(state)
            time.sleep(POLL_S)
        return seen

    def wait_all_done(self, numbers: range, timeout_s: float) -> collections.Counter[str]:
        wanted = {str(n) for n in numbers}

        def missing() -> set[str]:
            return wanted - set(self.done_counts())

        self.wait_for(f"{len(wanted)} tasks done", lambda: not missing(), timeout_s)
        return self.done_counts()

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.stderr().splitlines()[-lines:])

    # -- ending -----------------------------------------------------------------------
    def terminate(self, timeout_s: float = 10.0) -> int:
        """SIGTERM and wait; returns the exit code."""
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout_s)

    def kill(self) -> None:
        if self.alive():
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)


@pytest.fixture
def spawn_worker(tmp_path: Path) -> Iterator[Callable[[str], WorkerProcess]]:
    """Start subprocess workers; any still running at teardown are killed."""
    workers: list[WorkerProcess] = []

    def spawn(redis_url: str) -> WorkerProcess:
        w = WorkerProcess(redis_url, tmp_path / f"worker{len(workers)}")
        workers.append(w)
        w.wait_state("READING")
        return w

    yield spawn
    for w in workers:
        w.kill()


@pytest.fixture
def proxy(private_redis: RedisServer) -> Iterator[FaultProxy]:
    """A fault-injecting proxy in front of the test's own server."""
    with FaultProxy(private_redis.port) as p:
        yield p


def direct_client(server: RedisServer, *, socket_timeout_s: float = 5.0) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=server.port, socket_timeout=socket_timeout_s, decode_responses=True)


def enqueue(server: RedisServer, numbers: range, *, sleep_s: float = 0.0, socket_timeout_s: float = 5.0) -> None:
    """XADD one ``record`` task per number, straight to the server (the same encoding as ``plaita enqueue``)."""
    client = direct_client(server, socket_timeout_s=socket_timeout_s)
    try:
        q = StreamQueue(client, stream=STREAM, group="", consumer="", dlq_key="", dlq_max_len=1)
        params: list[dict[str, Any]] = [{"n": n, "sleep_s": sleep_s} if sleep_s else {"n": n} for n in numbers]
        q.enqueue_many([{"type": "start", "flow_id": "chaos", "params": p} for p in params])
    finally:
        client.close()


def wait_settled(worker: WorkerProcess, server: RedisServer, timeout_s: float = 10.0) -> None:
    """Every ack reached Redis: the stream is empty (acks XDEL) and nothing is pending."""
    client = direct_client(server)

    def settled() -> bool:
        if client.xlen(STREAM) != 0:
            return False
        groups = client.xinfo_groups(STREAM)
        return all(int(g["pending"]) == 0 for g in groups)

    try:
        worker.wait_for("the stream to be empty and nothing pending", settled, timeout_s)
    finally:
        client.close()


def duplicates(counts: collections.Counter[str]) -> int:
    return sum(c - 1 for c in counts.values() if c > 1)


def assert_one_log_pair_per_outage(worker: WorkerProcess, outages: int | None = 1) -> int:
    """Each outage logs one "unavailable" warning then one "back" info; returns the outage count."""
    lines = worker.outage_lines()
    kinds = ["down" if UNAVAILABLE in ln else "up" for ln in lines]
    assert kinds == ["down", "up"] * (len(kinds) // 2) and len(kinds) % 2 == 0, "\n".join(lines)
    assert all(" WARNING " in ln for ln in lines if UNAVAILABLE in ln), "\n".join(lines)
    assert all(" INFO " in ln for ln in lines if BACK in ln), "\n".join(lines)
    if outages is not None:
        assert len(kinds) // 2 == outages, "\n".join(lines)
    return len(kinds) // 2


def finish(worker: WorkerProcess) -> None:
    """The worker is alive after the fault and SIGTERM ends it with exit code 0."""
    assert worker.alive(), worker.tail()
    assert worker.terminate() == 0, worker.tail()


def report(name: str, **values: object) -> None:
    print(f"[chaos] {name}: " + ", ".join(f"{k}={v}" for k, v in values.items()))


class TestServerFreeze:
    """SIGSTOP/SIGCONT: every command times out for a while, then Redis answers again."""

    FREEZE_S = 5.0

    def test_freeze_5s_while_tasks_flow(
        self, private_redis: RedisServer, spawn_worker: Callable[[str], WorkerProcess]
    ) -> None:
        """A 5 s freeze mid-run: the worker backs off, comes back to READING and completes all 200 tasks."""
        worker = spawn_worker(private_redis.url)
        enqueue(private_redis, range(0, 100), sleep_s=0.01)
        worker.wait_for("20 tasks done", lambda: len(worker.done_counts()) >= 20, 10)

        private_redis.freeze()
        frozen_at = time.monotonic()
        # Enqueued during the freeze: the XADD waits in the socket until the thaw.
        during = threading.Thread(
            target=enqueue, args=(private_redis, range(100, 150)), kwargs={"socket_timeout_s": 30}
        )
        during.start()
        try:
            seen = worker.watch_states(self.FREEZE_S)
        finally:
            private_redis.thaw()
        thawed_at = time.monotonic()
        during.join(30)
        assert not during.is_alive()
        assert "BACKOFF" in seen, f"states seen during the freeze: {seen}"

        worker.wait_state("READING", 15)
        recovered_s = time.monotonic() - thawed_at
        enqueue(private_redis, range(150, 200))
        counts = worker.wait_all_done(range(200), 30)
        wait_settled(worker, private_redis)
        dupes = duplicates(counts)
        report(
            "freeze",
            frozen_s=round(thawed_at - frozen_at, 2),
            reading_again_after_s=round(recovered_s, 2),
            duplicates=dupes,
            states=sorted(seen),
        )
        assert dupes <= IN_FLIGHT_MAX, counts.most_common(10)
        assert_one_log_pair_per_outage(worker)
        finish(worker)


class TestServerKill:
    """kill -9 and restart on the same port, with and without the data."""

    def test_kill9_restart_with_persistence_loses_nothing(
        self, private_redis: RedisServer, spawn_worker: Callable[[str], WorkerProcess]
    ) -> None:
        """kill -9 mid-run, restart with the AOF: every task completes and the worker lives."""
        worker = spawn_worker(private_redis.url)
        enqueue(private_redis, range(0, 80), sleep_s=0.01)
        worker.wait_for("10 tasks done", lambda: len(worker.done_counts()) >= 10, 10)

        private_redis.kill()
        worker.wait_state("BACKOFF", 10)
        private_redis.restart(keep_data=True)
        enqueue(private_redis, range(80, 100))
        counts = worker.wait_all_done(range(100), 30)
        wait_settled(worker, private_redis)
        report("kill9-persist", duplicates=duplicates(counts))
        assert duplicates(counts) <= IN_FLIGHT_MAX, counts.most_common(10)
        assert_one_log_pair_per_outage(worker)
        finish(worker)

    def test_kill9_restart_without_data_recreates_group(
        self, private_redis: RedisServer, spawn_worker: Callable[[str], WorkerProcess]
    ) -> None:
        """kill -9 and an empty restart: the group is recreated (warned once) and new tasks are consumed."""
        worker = spawn_worker(private_redis.url)
        enqueue(private_redis, range(0, 5))
        worker.wait_all_done(range(5), 10)

        private_redis.kill()
        worker.wait_state("BACKOFF", 10)
        private_redis.restart(keep_data=False)
        worker.wait_for("the recreated warning", lambda: "recreated" in worker.stderr(), 15)
        client = direct_client(private_redis)
        try:
            assert [g["name"] for g in client.xinfo_groups(STREAM)] == [GROUP]
        finally:
            client.close()
        enqueue(private_redis, range(5, 25))
        worker.wait_all_done(range(25), 15)
        wait_settled(worker, private_redis)
        recreated = [ln for ln in worker.stderr().splitlines() if "recreated" in ln]
        assert len(recreated) == 1 and " WARNING " in recreated[0], recreated
        assert_one_log_pair_per_outage(worker)
        finish(worker)


class TestNetworkFaults:
    """A proxy between worker and Redis drops the path or resets connections; Redis itself is fine."""

    BLACKHOLE_S = 10.0

    def test_blackhole_10s_then_restore(
        self, private_redis: RedisServer, proxy: FaultProxy, spawn_worker: Callable[[str], WorkerProcess]
    ) -> None:
        """A silent network path for 10 s: the worker backs off, survives and finishes every task Redis holds."""
        worker = spawn_worker(proxy.url)
        enqueue(private_redis, range(0, 40), sleep_s=0.01)
        worker.wait_for("5 tasks done", lambda: len(worker.done_counts()) >= 5, 10)

        proxy.blackhole()
        enqueue(private_redis, range(40, 80))  # pending in Redis while the path is dead
        try:
            seen = worker.watch_states(self.BLACKHOLE_S)
        finally:
            proxy.restore()
        restored_at = time.monotonic()
        assert "BACKOFF" in seen, f"states seen during the blackhole: {seen}"

        counts = worker.wait_all_done(range(80), 30)
        all_done_s = time.monotonic() - restored_at
        wait_settled(worker, private_redis)
        report(
            "blackhole",
            all_done_after_restore_s=round(all_done_s, 2),
            duplicates=duplicates(counts),
            proxy_connections_accepted=proxy.accepted,
        )
        assert duplicates(counts) <= IN_FLIGHT_MAX, counts.most_common(10)
        assert_one_log_pair_per_outage(worker)
        finish(worker)

    def test_latency_below_the_socket_timeout_is_no_outage(
        self, private_redis: RedisServer, proxy: FaultProxy, spawn_worker: Callable[[str], WorkerProcess]
    ) -> None:
        """50 ms added to every forwarded chunk: slower, but no outage is logged and every task completes once."""
        proxy.latency_s = 0.05
        worker = spawn_worker(proxy.url)
        started = time.monotonic()
        enqueue(private_redis, range(0, 20))
        counts = worker.wait_all_done(range(20), 30)
        wait_settled(worker, private_redis)
        report("latency", latency_s=proxy.latency_s, twenty_tasks_s=round(time.monotonic() - started, 2))
        assert duplicates(counts) == 0, counts.most_common(5)
        assert worker.outage_lines() == []
        finish(worker)

    def test_connection_resets(
        self, private_redis: RedisServer, proxy: FaultProxy, spawn_worker: Callable[[str], WorkerProcess]
    ) -> None:
        """Every connection reset (RST) four times mid-run: the worker reconnects each time and finishes all."""
        worker = spawn_worker(proxy.url)
        enqueue(private_redis, range(0, 120), sleep_s=0.01)
        resets = 4
        for round_no in range(1, resets + 1):
            worker.wait_for(f"{round_no * 10} tasks done", lambda r=round_no: len(worker.done_counts()) >= r * 10, 15)
            accepted = proxy.accepted
            assert proxy.reset_all() >= 1
            worker.wait_for("a reconnect", lambda a=accepted: proxy.accepted > a, 10)
            worker.wait_state("READING", 10)
        counts = worker.wait_all_done(range(120), 30)
        wait_settled(worker, private_redis)
        outages = assert_one_log_pair_per_outage(worker, outages=None)
        report("resets", resets=resets, outages_logged=outages, duplicates=duplicates(counts))
        assert 1 <= outages <= resets
        assert duplicates(counts) <= IN_FLIGHT_MAX * resets, counts.most_common(10)
        finish(worker)
