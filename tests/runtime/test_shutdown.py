"""Shutdown of a real ``python -m plaita worker`` process on the private Redis, and bad flags.

Times are measured with time.monotonic from os.kill to the return of proc.wait; the worker is
first seen READING through its --status-file.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.support.handlers import read_log
from tests.support.workers import run_cli, wait_for, worker_process

pytestmark = pytest.mark.redis

STREAM = "plaita:test:queue"
GROUP = "plaita-workers"
#: The issue's bound for an idle worker to exit after SIGTERM/SIGINT.
IDLE_STOP_S = 1.0


def add_task(rclient: redis.Redis, n: int, **params: Any) -> str:
    body = {"type": "start", "flow_id": "f", "params": {"n": n, **params}}
    return str(rclient.xadd(STREAM, {"payload": json.dumps(body), "schema_version": "1"}))


def log_events(tmp_path: Path, name: str = "w") -> list[tuple[str, str, str, int]]:
    return read_log(str(tmp_path / f"{name}.log"))


def assert_left_for_redelivery(rclient: redis.Redis, message_id: str, n: int) -> None:
    """The unfinished task is still in the stream, unacked: pending as is, or handed back unread."""
    entries = rclient.xrange(STREAM)
    assert len(entries) == 1, entries
    entry_id, fields = entries[0]
    assert json.loads(fields["payload"])["params"]["n"] == n
    summary = rclient.xpending(STREAM, GROUP)
    if entry_id == message_id:
        assert summary["pending"] == 1  # left in the PEL, never acked
    else:
        assert summary["pending"] == 0  # handed back: a fresh entry the group has not delivered yet
        group = next(g for g in rclient.xinfo_groups(STREAM) if g["name"] == GROUP)
        assert group["lag"] == 1
    assert rclient.xlen(f"{STREAM}:dlq") == 0


class TestSignals:
    """SIGTERM and SIGINT stop the worker gracefully with exit code 0."""

    def test_idle_sigterm_exits_within_a_second_every_time(self, redis_url: str, tmp_path: Path) -> None:
        """Ten idle workers in a row each exit 0 within 1 s of SIGTERM."""
        timings = []
        for i in range(10):
            with worker_process(redis_url, tmp_path, name=f"idle{i}") as wp:
                wp.wait_state("READING")
                rc, elapsed_s = wp.signal_and_time(signal.SIGTERM)
                assert rc == 0, wp.stderr()
                assert "Traceback" not in wp.stderr()
                timings.append(elapsed_s)
        assert max(timings) < IDLE_STOP_S, timings

    def test_idle_sigint_exits_zero(self, redis_url: str, tmp_path: Path) -> None:
        """SIGINT (Ctrl-C) stops an idle worker like SIGTERM: exit 0 within 1 s, no traceback."""
        with worker_process(redis_url, tmp_path) as wp:
            wp.wait_state("READING")
            rc, elapsed_s = wp.signal_and_time(signal.SIGINT)
            assert rc == 0, wp.stderr()
            assert elapsed_s < IDLE_STOP_S
            assert "Traceback" not in wp.stderr()
            assert "KeyboardInterrupt" not in wp.stderr()


class TestDrain:
    """A task in flight at SIGTERM is finished within the drain timeout, else left for redelivery."""

    def test_sigterm_waits_for_the_running_task_and_acks_it(
        self, redis_url: str, rclient: redis.Redis, tmp_path: Path
    ) -> None:
        """SIGTERM during a 1 s task: the task finishes, is acked and deleted, then exit 0."""
        with worker_process(
            redis_url, tmp_path, "--handler", "tests.support.handlers:record", "--drain-timeout-s", "5"
        ) as wp:
            wp.wait_state("READING")
            mid = add_task(rclient, 1, sleep_s=1.0)
            wait_for(lambda: ("start", mid, "1", 1) in log_events(tmp_path), 10.0, "the task to start")
            rc, _elapsed_s = wp.signal_and_time(signal.SIGTERM)
            assert rc == 0, wp.stderr()
        assert log_events(tmp_path) == [("start", mid, "1", 1), ("done", mid, "1", 1)]
        assert rclient.xpending(STREAM, GROUP)["pending"] == 0
        assert rclient.xlen(STREAM) == 0

    def test_drain_timeout_leaves_the_task_unacked(self, redis_url: str, rclient: redis.Redis, tmp_path: Path) -> None:
        """A 30 s task and --drain-timeout-s 0.5: exit 0 after about 0.5 s; the task is not acked."""
        with worker_process(
            redis_url, tmp_path, "--handler", "tests.support.handlers:record", "--drain-timeout-s", "0.5"
        ) as wp:
            wp.wait_state("READING")
            mid = add_task(rclient, 7, sleep_s=30)
            wait_for(lambda: ("start", mid, "7", 1) in log_events(tmp_path), 10.0, "the task to start")
            rc, elapsed_s = wp.signal_and_time(signal.SIGTERM)
            assert rc == 0, wp.stderr()
        assert 0.45 <= elapsed_s < 5.0, elapsed_s  # it did wait for the drain, and no longer than bounded
        # The handler ran once; it may have returned when cancelled, but its task is not acked.
        assert [e for e in log_events(tmp_path) if e[0] == "start"] == [("start", mid, "7", 1)]
        assert_left_for_redelivery(rclient, mid, 7)

    def test_second_sigterm_stops_at_once(self, redis_url: str, rclient: redis.Redis, tmp_path: Path) -> None:
        """A second SIGTERM during a 20 s drain stops at once; the running task is not acked."""
        with worker_process(
            redis_url, tmp_path, "--handler", "tests.support.handlers:record", "--drain-timeout-s", "20"
        ) as wp:
            wp.wait_state("READING")
            mid = add_task(rclient, 3, sleep_s=30)
            wait_for(lambda: ("start", mid, "3", 1) in log_events(tmp_path), 10.0, "the task to start")
            wp.proc.send_signal(signal.SIGTERM)
            wp.wait_state("STOPPING")
            rc, elapsed_s = wp.signal_and_time(signal.SIGTERM)
            assert rc == 0, wp.stderr()
        assert elapsed_s < 5.0, elapsed_s  # far below the 20 s drain
        assert [e for e in log_events(tmp_path) if e[0] == "start"] == [("start", mid, "3", 1)]
        assert_left_for_redelivery(rclient, mid, 3)


class TestBadConfiguration:
    """Bad flags exit 2 with one line on stderr, no traceback, and never echo a password."""

    @pytest.mark.parametrize(
        "args",
        [
            pytest.param(["--concurrency", "abc"], id="concurrency-not-int"),
            pytest.param(["--concurrency", "0"], id="concurrency-zero"),
            pytest.param(["--redis-url", "http://x"], id="url-scheme"),
            pytest.param(["--read-block-ms", "5"], id="block-too-small"),
            pytest.param(["--redis-url", "redis://:s3cret@host:notaport/0"], id="url-bad-port-with-password"),
            pytest.param(["--redis-url", "redis://user:s3cret@host:6379/zero"], id="url-bad-db-with-password"),
            pytest.param(["--handler", "nosuch:thing"], id="handler-missing-module"),
            pytest.param(["--handler", "plaita.runtime.handlers:nosuch"], id="handler-missing-attr"),
        ],
    )
    def test_bad_flag_exits_2(self, args: list[str], redis_url: str) -> None:
        """The worker refuses to start: exit 2, a one-line reason, nothing secret."""
        argv = ["worker", *args] if "--redis-url" in args else ["worker", "--redis-url", redis_url, *args]
        result = run_cli(*argv)
        assert result.returncode == 2, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        assert "error" in lines[0]
        assert "Traceback" not in result.stderr
        assert "s3cret" not in result.stderr + result.stdout
