"""Subprocess workers with registry, control and metrics on, the admin CLI, and HTTP probes.

Used by tests/test_ops_*.py. Every worker is ``python -m plaita worker`` with a short read
block, heartbeat and registry TTL so fleet behaviour is observable within a second or two.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from prometheus_client.parser import text_string_to_metric_families

from plaita.ops.status import read_status_file
from tests.support.handlers import read_log
from tests.support.redis_server import free_port

ROOT = Path(__file__).resolve().parent.parent.parent
QUEUE = "plaita:test:queue"
DLQ = f"{QUEUE}:dlq"
#: Registry key prefix (kept literal: the tests pin the key layout operators rely on).
REGISTRY_PREFIX = "plaita:registry:flow_worker:"


def wait_until(predicate: Callable[[], Any], timeout_s: float, what: str, poll_s: float = 0.02) -> Any:
    """Poll ``predicate`` until it returns something truthy (returned); AssertionError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(poll_s)


def holds_for(predicate: Callable[[], bool], duration_s: float, what: str, poll_s: float = 0.02) -> None:
    """Assert ``predicate`` stays true for the whole of ``duration_s`` (an absence check)."""
    deadline = time.monotonic() + duration_s
    while time.monotonic() < deadline:
        assert predicate(), f"{what} stopped holding"
        time.sleep(poll_s)


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PLAITA_", "NOTIFY_SOCKET", "WATCHDOG_"))}
    env.pop("REDIS_URL", None)
    env.pop("QUEUE_NAME", None)
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


def plaita(url: str, *args: str, timeout_s: float = 60.0, queue: str = QUEUE) -> subprocess.CompletedProcess[str]:
    """``python -m plaita CMD --redis-url URL --queue-name Q REST…`` with no TTY on stdin."""
    cmd, *rest = args
    argv = [sys.executable, "-m", "plaita", cmd, "--redis-url", url]
    if cmd != "demo":
        argv += ["--queue-name", queue]
    return subprocess.run(
        [*argv, *rest],
        cwd=str(ROOT),
        env=clean_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def plaita_many(url: str, commands: list[tuple[str, ...]], timeout_s: float = 60.0) -> list[tuple[int, str, str]]:
    """Run independent CLI commands concurrently; (exit code, stdout, stderr) of each, in order."""
    procs = []
    for args in commands:
        cmd, *rest = args
        argv = [sys.executable, "-m", "plaita", cmd, "--redis-url", url, "--queue-name", QUEUE, *rest]
        procs.append(
            subprocess.Popen(
                argv,
                cwd=str(ROOT),
                env=clean_env(),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )  # fmt: skip
        )
    results = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=timeout_s)
            results.append((proc.returncode, out, err))
    finally:  # a timeout fails the test; it must not leave processes and their pipes behind
        for proc in procs[len(results) :]:
            proc.kill()
            proc.communicate(timeout=10)
    return results


def plaita_json(url: str, *args: str) -> Any:
    """Run a read command with ``--json`` and parse its stdout (fails the test on exit != 0)."""
    done = plaita(url, *args, "--json")
    assert done.returncode == 0, f"plaita {' '.join(args)} --json exited {done.returncode}: {done.stderr}"
    return json.loads(done.stdout)


def enqueue(client: redis.Redis, body: dict[str, Any] | str, *, queue: str = QUEUE) -> str:
    """XADD one task (a dict is JSON-encoded; a str is stored as the raw payload)."""
    payload = body if isinstance(body, str) else json.dumps(body)
    mid = client.xadd(queue, {"payload": payload, "schema_version": "1"})
    return mid.decode() if isinstance(mid, bytes) else str(mid)


def task(n: int, **params: Any) -> dict[str, Any]:
    return {"type": "start", "flow_id": f"f{n}", "params": {"n": n, **params}}


def parse_metrics(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a Prometheus text exposition, keyed by (sample name, sorted labels)."""
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    return out


@dataclass
class OpsWorker:
    """One ``plaita worker`` subprocess with its identity, ports and files."""

    proc: subprocess.Popen[bytes]
    url: str
    instance_id: str
    consumer: str
    metrics_port: int
    status_file: Path
    stderr_file: Path
    log_path: Path

    # -- HTTP ---------------------------------------------------------------------------
    def http(self, path: str, timeout_s: float = 2.0) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}{path}", timeout=timeout_s) as r:
                return int(r.status), r.read().decode()
        except urllib.error.HTTPError as exc:
            return int(exc.code), exc.read().decode()

    def try_http(self, path: str) -> tuple[int, str] | None:
        """Like ``http`` but None while the server is not listening yet."""
        try:
            return self.http(path)
        except OSError:
            return None

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        code, text = self.http("/metrics")
        assert code == 200, f"/metrics answered {code}"
        return parse_metrics(text)

    def sample(self, name: str, **labels: str) -> float | None:
        return self.metrics().get((name, tuple(sorted(labels.items()))))

    def readyz(self) -> tuple[int, str] | None:
        return self.try_http("/readyz")

    # Deadlines, not delays: a CI run on a loaded 2-core machine once took > 10 s to confirm the group.
    def wait_ready(self, timeout_s: float = 30.0) -> None:
        last: list[tuple[int, str] | None] = [None]

        def ready() -> bool:
            self.assert_alive()
            last[0] = r = self.readyz()
            return r is not None and r[0] == 200

        try:
            wait_until(ready, timeout_s, f"{self.instance_id} /readyz 200")
        except AssertionError as e:  # say why it was not ready: the reason is the whole diagnosis
            raise AssertionError(f"{e}; last /readyz reply: {last[0]!r}") from None

    # -- files --------------------------------------------------------------------------
    def status(self) -> dict[str, Any] | None:
        return read_status_file(self.status_file)

    def wait_state(self, state: str, timeout_s: float = 30.0) -> None:
        def reached() -> bool:
            self.assert_alive()
            st = self.status()
            return st is not None and st.get("state") == state

        wait_until(reached, timeout_s, f"{self.instance_id} state {state}")

    def stderr(self) -> str:
        try:
            return self.stderr_file.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def executions(self) -> list[tuple[str, str, str, int]]:
        """(event, message id, n, delivery count) lines of the ``record`` handler."""
        return read_log(str(self.log_path))

    def done_ids(self) -> set[str]:
        return {mid for event, mid, _n, _d in self.executions() if event == "done"}

    def started_ids(self) -> set[str]:
        return {mid for event, mid, _n, _d in self.executions() if event == "start"}

    # -- process ------------------------------------------------------------------------
    def assert_alive(self) -> None:
        if self.proc.poll() is not None:
            raise AssertionError(f"worker {self.instance_id} exited with {self.proc.returncode}:\n{self.stderr()}")

    def wait_exit(self, timeout_s: float = 10.0) -> int:
        return self.proc.wait(timeout_s)

    def terminate(self, timeout_s: float = 10.0) -> int:
        os.kill(self.proc.pid, signal.SIGTERM)
        return self.proc.wait(timeout_s)

    def control_subscribed(self, client: redis.Redis) -> bool:
        """True once Redis counts this worker's control listener on its channel."""
        channel = f"plaita:control:{self.instance_id}"
        counts = {(k.decode() if isinstance(k, bytes) else k): v for k, v in client.pubsub_numsub(channel)}
        return counts.get(channel, 0) == 1

    def registry_entry(self, client: redis.Redis) -> dict[str, Any] | None:
        raw = client.get(REGISTRY_PREFIX + self.instance_id)
        return None if raw is None else dict(json.loads(raw))


@contextmanager
def ops_worker(
    url: str,
    tmp_path: Path,
    *extra: str,
    name: str = "w",
    env: dict[str, str] | None = None,
    handler: str = "tests.support.handlers:record",
    wait_ready: bool = True,
) -> Iterator[OpsWorker]:
    """Start ``plaita worker`` with registry, control and metrics on; killed afterwards if still running."""
    instance_id = f"{name}-{uuid.uuid4().hex[:8]}"
    consumer = f"{name}-host:0"
    port = free_port()
    status_file = tmp_path / f"{name}.status.json"
    stderr_file = tmp_path / f"{name}.stderr"
    log_path = tmp_path / f"{name}.log"
    cmd = [
        sys.executable, "-m", "plaita", "worker",
        "--redis-url", url,
        "--queue-name", QUEUE,
        "--consumer-name", consumer,
        "--instance-id", instance_id,
        *(() if {"--flows", "--keeper"} & set(extra) else ("--handler", handler)),  # a flow worker runs none
        "--read-block-ms", "200",
        "--heartbeat-interval", "0.5",
        "--registry-ttl", "2",
        "--metrics-port", str(port),
        "--metrics-host", "127.0.0.1",
        "--status-file", str(status_file),
        "--drain-timeout-s", "5",
        *extra,
    ]  # fmt: skip
    full_env = clean_env(PLAITA_TEST_LOG=str(log_path), PLAITA_TEST_REDIS_URL=url, **(env or {}))
    with open(stderr_file, "wb") as err:
        proc = subprocess.Popen(cmd, cwd=str(ROOT), env=full_env, stdout=subprocess.DEVNULL, stderr=err)
    worker = OpsWorker(proc, url, instance_id, consumer, port, status_file, stderr_file, log_path)
    try:
        if wait_ready:
            worker.wait_ready()
        yield worker
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


__all__ = [
    "DLQ",
    "QUEUE",
    "REGISTRY_PREFIX",
    "OpsWorker",
    "enqueue",
    "holds_for",
    "ops_worker",
    "parse_metrics",
    "plaita",
    "plaita_json",
    "plaita_many",
    "task",
    "wait_until",
]
