"""``plaita dev`` end to end, in a subprocess: it comes up on an embedded server, the dashboard
answers, an execution of the example completes, a changed flows file restarts the worker, and
SIGINT stops everything (no server, worker or dashboard process left). Every wait is bounded."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from plaita.cli.dev import TASKS_QUEUE
from plaita.flows import FlowClient
from tests.support.redis_server import free_port
from tests.support.workers import wait_for

ROOT = Path(__file__).resolve().parent.parent.parent
#: Bound of every wait for the command (a loaded CI machine is slow to start three processes).
UP_TIMEOUT_S = 60.0
#: What a stop may take at most here (it takes about a second: the dashboard's shutdown).
STOP_BOUND_S = 10.0

#: Three processes started and waited for, each wait bounded by UP_TIMEOUT_S.
pytestmark = pytest.mark.timeout(240)

RELOADABLE = """
from plaita import Flow

first = Flow("first")


@first.step
def one(ctx):
    return {"v": 1}
"""


class DevProcess:
    """``python -m plaita dev ...`` with its output read on a thread (so no read blocks a test)."""

    def __init__(self, args: list[str], cwd: Path, tmp: Path) -> None:
        env = {**os.environ, "XDG_CACHE_HOME": str(tmp / "cache"), "PYTHONPATH": str(ROOT)}
        env.pop("PLAITA_DASHBOARD_TOKEN", None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "plaita", "dev", *args], cwd=cwd, env=env, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)

    def wait_line(self, pattern: str, timeout_s: float = UP_TIMEOUT_S) -> re.Match[str]:
        deadline = time.monotonic() + timeout_s
        while (left_s := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=left_s)
            except queue.Empty:
                break
            self.seen.append(line)
            found = re.search(pattern, line)
            if found:
                return found
        raise AssertionError(f"no line matching {pattern!r} in {timeout_s:g} s; output:\n{''.join(self.seen)}")

    def stop(self) -> float:
        started = time.monotonic()
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(STOP_BOUND_S)
        return time.monotonic() - started

    def close(self) -> None:
        """Kill it if it still runs, and close its output once the reader has read it all."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._reader.join(10)
        assert self.proc.stdout is not None
        self.proc.stdout.close()


@pytest.fixture
def dev_process(tmp_path: Path) -> Iterator[list[DevProcess]]:
    started: list[DevProcess] = []
    yield started
    for dev in started:
        dev.close()


def processes_with(text: str) -> list[int]:
    """Pids of processes whose command line holds ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def gone(pid: int) -> bool:
    """No such process, or only its zombie (exited, its parent has not read its status)."""
    try:
        return "State:\tZ" in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True


def wait_http_200(url: str, timeout_s: float = UP_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=5) as reply:
                if reply.status == 200:
                    return
                last = reply.status
        except OSError as exc:
            last = exc
        time.sleep(0.1)
    raise AssertionError(f"{url} did not answer 200 in {timeout_s:g} s ({last})")


def test_plaita_dev_runs_the_example_and_stops_everything_on_sigint(
    tmp_path: Path, dev_process: list[DevProcess]
) -> None:
    port = free_port()
    dev = DevProcess(["--flows", "examples.shop.flows", "--dashboard-port", str(port)], ROOT, tmp_path)
    dev_process.append(dev)
    server = dev.wait_line(r"\(pid (\d+)\) on (redis://127\.0\.0\.1:(\d+)/0)")
    server_pid, url, redis_port = int(server[1]), server[2], server[3]
    assert redis_port != "6379"
    dashboard = dev.wait_line(r"dashboard  (http://127\.0\.0\.1:\d+/)")[1]
    dev.wait_line(r"Ctrl-C stops everything")
    wait_http_200(dashboard)
    with FlowClient.from_url(url, socket_timeout_s=5.0) as flows:
        eid = flows.start("ship_line", {"order_id": "o-1", "sku": "mug"})
        doc = flows.wait(eid, timeout_s=UP_TIMEOUT_S)
    assert doc["status"] == "completed" and doc["state"]["tracking"] == "TRK-o-1-mug"
    children = [p for p in processes_with(f"127.0.0.1:{redis_port}") if p != server_pid]
    assert len(children) == 2  # the worker and the dashboard
    assert (tmp_path / "cache" / "plaita" / "dev" / "examples.shop.flows" / "appendonlydir").is_dir()

    assert dev.stop() < STOP_BOUND_S and dev.proc.returncode == 0
    assert gone(server_pid), "the embedded server outlived plaita dev"
    assert all(gone(p) for p in children), "a worker or the dashboard outlived plaita dev"


def test_plaita_dev_restarts_the_worker_when_a_flows_file_changes(
    tmp_path: Path, dev_process: list[DevProcess]
) -> None:
    app = tmp_path / "devapp"
    app.mkdir()
    (app / "__init__.py").write_text("")
    (app / "flows.py").write_text(RELOADABLE)
    tasks = ["--tasks", "plaita.runtime.handlers:echo"]  # and a plain-task worker beside
    dev = DevProcess(["--flows", "devapp.flows", "--no-dashboard", *tasks], tmp_path, tmp_path)
    dev_process.append(dev)
    url = dev.wait_line(r"on (redis://127\.0\.0\.1:\d+/0)")[1]
    dev.wait_line(r"Ctrl-C stops everything")
    changed = RELOADABLE + '\nsecond = Flow("second")\n\n\n@second.step\ndef two(ctx):\n    return {"v": 2}\n'
    (app / "flows.py").write_text(changed)
    os.utime(app / "flows.py", (time.time() + 5, time.time() + 5))  # a new mtime, however coarse the clock
    dev.wait_line(r"flows\.py changed: the workers were restarted")
    with FlowClient.from_url(url, socket_timeout_s=5.0) as flows:
        doc = flows.wait(flows.start("second"), timeout_s=UP_TIMEOUT_S)
    assert doc["status"] == "completed" and doc["state"] == {"v": 2}
    enqueue = [sys.executable, "-m", "plaita", "enqueue", "--redis-url", url, "--queue-name", TASKS_QUEUE]
    subprocess.run([*enqueue, '{"type": "start", "execution_id": "t-1"}'], check=True, timeout=30, capture_output=True)
    client = redis.Redis.from_url(url, socket_timeout=5, decode_responses=True)
    try:
        wait_for(lambda: _acked_all(client), UP_TIMEOUT_S, "the tasks worker to ack its task")
    finally:
        client.close()
    assert dev.stop() < STOP_BOUND_S and dev.proc.returncode == 0


def _acked_all(client: redis.Redis) -> bool:
    groups = client.xinfo_groups(TASKS_QUEUE) if client.exists(TASKS_QUEUE) else []
    return bool(groups) and groups[0]["entries-read"] == 1 and groups[0]["pending"] == 0


def test_plaita_dev_refuses_port_6379_and_a_missing_module(tmp_path: Path) -> None:
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    for args, message in (
        (["--flows", "examples.shop.flows", "--redis-port", "6379"], "never touches it"),
        (["--flows", "no_such_module_here"], "cannot find module 'no_such_module_here'"),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "plaita", "dev", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_two_plaita_dev_never_share_a_data_dir(tmp_path: Path) -> None:
    from plaita.cli.dev_parts import DataDirLock
    from plaita.errors import ConfigError

    first = DataDirLock(tmp_path)
    try:
        with pytest.raises(ConfigError, match=f"in use by another plaita dev \\(pid {os.getpid()}\\)"):
            DataDirLock(tmp_path)
    finally:
        first.release()
    DataDirLock(tmp_path).release()  # free again once released
