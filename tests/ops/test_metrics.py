"""/metrics, /healthz and /readyz of a real worker process, and its systemd notifications."""

from __future__ import annotations

import configparser
import os
import plistlib
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from plaita.config import DEFAULT_DRAIN_TIMEOUT_S
from plaita.fsm import State
from tests.support.ops import enqueue, ops_worker, plaita, task, wait_until
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.redis

#: Queue gauges are sampled every 5 s by the monitor thread: wait up to two periods and a bit.
QUEUE_SAMPLE_DEADLINE_S = 12.0
FREEZE_S = 3.0


def _completed(w: object) -> float:
    return w.sample("plaita_tasks_total", outcome="completed") or 0.0  # type: ignore[attr-defined]


class TestMetrics:
    def test_metrics_parse_and_move_as_tasks_flow(self, rclient: redis.Redis, redis_url: str, tmp_path: Path) -> None:
        """The exposition parses; state, transitions, task counters, handler histogram and DLQ gauge move."""
        with ops_worker(redis_url, tmp_path, "--max-deliveries", "1") as w:
            wait_until(lambda: w.sample("plaita_worker_state", state="READING") == 1, 3, "state gauge READING")
            m = w.metrics()
            assert m[("plaita_worker_up", ())] == 1
            states = {s.name: m[("plaita_worker_state", (("state", s.name),))] for s in State}
            # One-hot; a periodic reclaim pass may be running at the moment of this second scrape.
            assert sum(states.values()) == 1 and states["READING"] + states["RECLAIMING"] == 1, states
            assert m[("plaita_worker_transitions_total", (("from_state", "RECLAIMING"), ("to_state", "READING")))] >= 1
            before = _completed(w)
            count_before = m.get(("plaita_handler_duration_seconds_count", ()), 0.0)

            for n in range(4):
                enqueue(rclient, task(n))
            enqueue(rclient, task(9, fail=True))
            wait_until(lambda: _completed(w) == before + 4, 5, "plaita_tasks_total{outcome=completed} += 4")
            m = w.metrics()
            assert m[("plaita_tasks_total", (("outcome", "failed"),))] == 1
            assert m[("plaita_tasks_total", (("outcome", "dead_lettered"),))] == 1
            assert m[("plaita_handler_duration_seconds_count", ())] == count_before + 5
            assert m[("plaita_worker_in_flight", ())] == 0
            wait_until(
                lambda: w.sample("plaita_queue_dlq_length") == 1, QUEUE_SAMPLE_DEADLINE_S, "the DLQ gauge to reach 1"
            )
            assert w.http("/healthz") == (200, "ok\n")
            assert w.http("/nope")[0] == 404

    def test_paused_worker_is_alive_but_not_ready_and_queue_gauges_show_the_backlog(
        self, rclient: redis.Redis, redis_url: str, tmp_path: Path
    ) -> None:
        """Paused: /healthz 200, /readyz 503 "paused", state gauge PAUSED, length/lag gauges count the waiting tasks."""
        with ops_worker(redis_url, tmp_path) as w:
            assert w.http("/readyz")[0] == 200
            assert plaita(redis_url, "pause", w.instance_id).returncode == 0
            wait_until(lambda: w.http("/readyz")[0] == 503, 3, "/readyz 503 while paused")
            assert "paused" in w.http("/readyz")[1]
            assert w.http("/healthz")[0] == 200
            assert w.sample("plaita_worker_state", state="PAUSED") == 1
            assert w.sample("plaita_worker_state", state="READING") == 0
            for n in range(3):
                enqueue(rclient, task(n))

            def backlog_seen() -> bool:
                return w.sample("plaita_queue_stream_length") == 3 and w.sample("plaita_queue_lag") == 3

            wait_until(backlog_seen, QUEUE_SAMPLE_DEADLINE_S, "queue length and lag gauges = 3")
            assert plaita(redis_url, "resume", w.instance_id).returncode == 0
            wait_until(lambda: _completed(w) == 3, 5, "the backlog to be consumed after resume")
            w.wait_ready(3)


@pytest.mark.chaos
class TestReadinessThroughAFreeze:
    def test_readyz_flips_during_a_freeze_and_back(self, private_redis: RedisServer, tmp_path: Path) -> None:
        """Frozen Redis: /readyz 503 naming Redis, /healthz and /metrics still answer; after thaw /readyz is 200."""
        with ops_worker(private_redis.url, tmp_path) as w:
            wait_until(lambda: w.http("/readyz") == (200, "ok: READING\n"), 3, "/readyz ok: READING")
            private_redis.freeze()
            try:
                wait_until(lambda: w.http("/readyz")[0] == 503, FREEZE_S, "/readyz 503 during the freeze")
                reason = w.http("/readyz")[1]
                assert "redis" in reason.lower() or "backoff" in reason.lower(), reason
                started = time.monotonic()
                assert w.http("/healthz")[0] == 200
                assert w.sample("plaita_worker_up") == 1
                assert time.monotonic() - started < 1.0, "scrapes must not wait on a frozen Redis"
                time.sleep(max(0.0, FREEZE_S - 2.0))  # keep the fault on: its duration, not a synchronisation
            finally:
                private_redis.thaw()
            w.wait_ready(8)
            m = w.metrics()
            errors = sum(v for (name, labels), v in m.items() if name == "plaita_redis_errors_total")
            assert errors >= 1
            assert (
                m[("plaita_worker_transitions_total", (("from_state", "BACKOFF"), ("to_state", "ENSURE_GROUP")))] >= 1
            )
            assert m[("plaita_worker_backoff_seconds_total", ())] > 0


def _short_socket_dir() -> str:
    # AF_UNIX paths are limited to 108 bytes; pytest's tmp_path can be longer.
    return tempfile.mkdtemp(prefix="plaita-sd-", dir="/tmp")


@pytest.fixture
def notify_socket() -> Iterator[tuple[socket.socket, str]]:
    """A unix datagram socket standing in for systemd's $NOTIFY_SOCKET."""
    directory = _short_socket_dir()
    path = os.path.join(directory, "notify")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(0.2)
    try:
        yield sock, path
    finally:
        sock.close()
        shutil.rmtree(directory, ignore_errors=True)


def _drain(sock: socket.socket, into: list[str]) -> None:
    while True:
        try:
            into.append(sock.recv(4096).decode())
        except TimeoutError:
            return


class TestSystemdNotify:
    def test_ready_status_watchdog_and_stopping_reach_notify_socket(
        self, redis_url: str, tmp_path: Path, notify_socket: tuple[socket.socket, str]
    ) -> None:
        """Under a fake systemd: READY=1 and STATUS=READING once consuming, WATCHDOG=1 pings, STOPPING=1 on stop."""
        sock, path = notify_socket
        messages: list[str] = []
        env = {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "400000"}  # ping every 0.2 s
        with ops_worker(redis_url, tmp_path, env=env) as w:

            def pinged() -> bool:
                _drain(sock, messages)
                return messages.count("WATCHDOG=1") >= 3

            wait_until(pinged, 5, "three WATCHDOG=1 pings", poll_s=0)
            assert "READY=1" in messages and "STATUS=READING" in messages
            assert messages.index("READY=1") < messages.index("WATCHDOG=1")
            assert w.terminate() == 0
        _drain(sock, messages)
        assert "STOPPING=1" in messages, messages
        assert messages.count("READY=1") == 1, "READY=1 is sent once, not on every return to READING"


class TestDeployFiles:
    def test_systemd_unit_and_launchd_plist_fit_the_worker(self) -> None:
        """The unit is Type=notify with a watchdog, and both supervisors wait longer than the drain timeout."""
        root = Path(__file__).resolve().parents[2]
        unit = configparser.ConfigParser(strict=False, interpolation=None)
        unit.optionxform = str  # type: ignore[assignment,method-assign]
        unit.read(root / "deploy" / "plaita-worker.service", encoding="utf-8")
        service = unit["Service"]
        assert (service["Type"], service["NotifyAccess"], service["Restart"]) == ("notify", "main", "always")
        assert service["WatchdogSec"] == "30" and service["KillSignal"] == "SIGTERM"
        assert int(service["TimeoutStopSec"]) > DEFAULT_DRAIN_TIMEOUT_S + 2
        assert service["EnvironmentFile"].startswith("/") and service["ExecStart"].endswith("/.venv/bin/plaita worker")
        with open(root / "deploy" / "com.plaita.worker.plist", "rb") as f:
            plist = plistlib.load(f)
        assert plist["KeepAlive"] is True and plist["ProgramArguments"][1:] == ["worker"]
        assert plist["ExitTimeOut"] > DEFAULT_DRAIN_TIMEOUT_S + 2
