"""The pieces ``plaita dev`` supervises: child processes that die with it, a file watcher, the
data dir under the user's cache dir (locked, so two ``plaita dev`` never share one)."""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import importlib.util
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import IO

from plaita.errors import ConfigError

#: How long a child (worker, dashboard) has to exit on SIGTERM before it is killed.
CHILD_STOP_S = 1.5
#: The dashboard's port when it is free (``plaita dashboard``'s default), else any free one.
DASHBOARD_PORT = 8600
#: At most this many files are watched (a module in a huge tree is watched in part).
MAX_WATCHED_FILES = 2000
#: PR_SET_PDEATHSIG: the kernel sends a child the given signal when its parent dies.
_PR_SET_PDEATHSIG = 1


def default_data_dir(modules: list[str]) -> Path:
    """``$XDG_CACHE_HOME/plaita/dev/<modules>`` (``~/.cache`` without it): one per app."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", "+".join(modules))[:80] or "default"
    return base / "plaita" / "dev" / slug


class DataDirLock:
    """An exclusive lock on the data dir for as long as this ``plaita dev`` runs."""

    def __init__(self, data_dir: Path) -> None:
        data_dir.mkdir(parents=True, exist_ok=True)
        self.path = data_dir / "plaita-dev.lock"
        self._file: IO[str] | None = open(self.path, "a+", encoding="utf-8")  # noqa: SIM115 (held until release)
        try:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._file.seek(0)
            holder = self._file.read().strip() or "another process"
            self._file.close()
            self._file = None
            raise ConfigError(f"{data_dir} is in use by another plaita dev ({holder}); give --data-dir") from None
        self._file.seek(0)
        self._file.truncate()
        self._file.write(f"pid {os.getpid()}\n")
        self._file.flush()

    def release(self) -> None:
        if self._file is not None:
            self._file.close()  # closing drops the flock
            self._file = None


def remembered_port(data_dir: Path) -> int:
    """The port this data dir's server had last time, if it is free now, else a new free one
    (saved): the Redis URL stays the same from one ``plaita dev`` to the next."""
    saved = data_dir / "port"
    with contextlib.suppress(OSError, ValueError):
        port = int(saved.read_text(encoding="utf-8").strip())
        if port != 6379 and port_is_free(port):
            return port
    port = free_loopback_port()
    saved.write_text(f"{port}\n", encoding="utf-8")
    return port


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def dashboard_port(asked: int | None) -> int:
    """``asked``, or 8600 when free, else any free port (``asked`` 0: any free port)."""
    if asked:
        return asked
    return DASHBOARD_PORT if asked is None and port_is_free(DASHBOARD_PORT) else free_loopback_port()


def free_loopback_port() -> int:
    # Imported here: `plaita --help` (which builds this command's parser) loads no Redis client.
    from plaita.store.server import free_loopback_port as free

    return free()


def _die_with_parent() -> None:  # pragma: no cover (runs in the forked child)
    """Linux: SIGTERM this child when ``plaita dev`` dies, however it dies (kill -9 too)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class Child:
    """One child process (``python -m plaita ...``), restartable, in a session of its own (a
    Ctrl-C reaches ``plaita dev`` only, which stops it)."""

    def __init__(self, name: str, args: list[str], env: dict[str, str]) -> None:
        self.name = name
        self.args = args
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        preexec = _die_with_parent if sys.platform.startswith("linux") else None
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "plaita", *self.args], env=self.env, start_new_session=True, preexec_fn=preexec
        )

    def exited(self) -> int | None:
        """Its exit code once it has exited on its own, else None (None too when not started)."""
        return None if self.proc is None else self.proc.poll()

    def signal_stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def wait_stopped(self, timeout_s: float = CHILD_STOP_S) -> None:
        """Wait ``timeout_s`` for it to exit after ``signal_stop``, then kill it."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)

    def restart(self) -> None:
        self.signal_stop()
        self.wait_stopped()
        self.start()


def watched_paths(modules: list[str]) -> list[Path]:
    """The .py files a change of which reloads the worker: a package's tree, or the files beside
    a plain module (its helpers), for each module name. ConfigError for a module not found."""
    found: set[Path] = set()
    for name in modules:
        module = name.split(":", 1)[0]  # a handler is MODULE:CALLABLE
        try:
            spec = importlib.util.find_spec(module)
        except Exception as exc:  # finding a submodule runs its packages' __init__: anything may raise
            raise ConfigError(f"cannot find module {module!r}: {type(exc).__name__}: {exc}") from None
        if spec is None or spec.origin is None:
            raise ConfigError(f"cannot find module {module!r} (run plaita dev from your project's root)")
        if spec.submodule_search_locations:
            for location in spec.submodule_search_locations:
                found.update(Path(location).rglob("*.py"))
        else:
            found.update(Path(spec.origin).parent.glob("*.py"))
    return sorted(found)[:MAX_WATCHED_FILES]


class Watcher:
    """Polls the mtimes of files; ``changed()`` names one that changed since the last call."""

    def __init__(self, paths: list[Path]) -> None:
        self.paths = paths
        self._seen = self._snapshot()

    def _snapshot(self) -> dict[Path, float]:
        seen: dict[Path, float] = {}
        for path in self.paths:
            with contextlib.suppress(OSError):  # deleted: absent from the snapshot, a change
                seen[path] = path.stat().st_mtime
        return seen

    def changed(self) -> Path | None:
        now = self._snapshot()
        if now == self._seen:
            return None
        diff = [p for p in set(now) | set(self._seen) if now.get(p) != self._seen.get(p)]
        self._seen = now
        return sorted(diff)[0]
