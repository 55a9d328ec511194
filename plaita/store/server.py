"""A throwaway redis-server for ``plaita demo``: free loopback port, temp dir, no persistence.

Self-contained on purpose (the demo must not import from ``tests/``). Never uses port 6379.
It can be frozen (SIGSTOP) and thawed (SIGCONT) to show a worker riding out a Redis stall.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import redis

from plaita.errors import PlaitaError

#: Longest wait for a fresh server to answer PING.
READY_TIMEOUT_S = 10.0


class RedisServerError(PlaitaError, RuntimeError):
    """Raised when redis-server is missing or does not come up."""


def free_loopback_port() -> int:
    """A TCP port on 127.0.0.1 nothing listens on right now (never 6379)."""
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port != 6379:
            return port
    raise RedisServerError("no free loopback port found")


def wait_ready(proc: subprocess.Popen[bytes] | None, port: int, timeout_s: float, *, what: str, log: object) -> None:
    """Until a server we started answers PING on ``port``; RedisServerError when it exits or
    does not answer in ``timeout_s`` (naming ``what`` and its ``log``)."""
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RedisServerError(f"{what} exited with {proc.returncode} (log: {log})")
        client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=1, socket_connect_timeout=1)
        try:
            if client.ping():
                return
        except redis.RedisError as exc:
            last = f"{type(exc).__name__}: {exc}"
        finally:
            client.close()
        time.sleep(0.02)
    raise RedisServerError(f"{what} on port {port} not ready after {timeout_s:g} s ({last})")


class PrivateRedis:
    """One redis-server process in its own temp dir, owned by the caller; ``stop()`` removes it all."""

    def __init__(self) -> None:
        self.port = 0
        self.dir: Path | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.frozen = False

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = READY_TIMEOUT_S) -> PrivateRedis:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RedisServerError("redis-server is not installed (Debian/Ubuntu: apt-get install -y redis-server)")
        self.port = free_loopback_port()
        self.dir = Path(tempfile.mkdtemp(prefix="plaita-demo-redis-"))
        args = [
            binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
            "--save", "", "--appendonly", "no", "--daemonize", "no",
            "--logfile", str(self.dir / "redis.log"),
        ]  # fmt: skip
        # Own session: a Ctrl-C in the terminal reaches the demo, which then stops this cleanly.
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self._wait_ready(timeout_s)
        return self

    def _wait_ready(self, timeout_s: float) -> None:
        wait_ready(self.proc, self.port, timeout_s, what="redis-server", log=f"{self.dir}/redis.log")

    def freeze(self) -> None:
        """SIGSTOP: connections stay open but nothing is answered (clients see timeouts)."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGSTOP)
            self.frozen = True

    def thaw(self) -> None:
        """SIGCONT: the server resumes where it stopped."""
        if self.proc is not None and self.frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGCONT)
            self.frozen = False

    def stop(self) -> None:
        """Thaw if needed, terminate (kill past 5 s), remove the temp dir. Safe to call twice."""
        proc, self.proc = self.proc, None
        if proc is not None:
            if self.frozen:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGCONT)
                self.frozen = False
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None


def stop_process(proc: subprocess.Popen[bytes], timeout_s: float) -> int:
    """SIGTERM, wait ``timeout_s``, then SIGKILL; returns the exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    return int(proc.returncode)
