"""The demo's building blocks: its handler, the execution log, the worker process, the freeze."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from plaita.errors import PlaitaError
from plaita.store.errors import is_redis_failure
from plaita.store.queue_access import delete
from plaita.store.server import PrivateRedis, stop_process
from plaita.tasks import Task

if TYPE_CHECKING:
    from plaita.store.streams.queue import StreamQueue

#: Environment variable naming the file ``demo_handler`` appends one line per execution to.
DEMO_LOG_ENV = "PLAITA_DEMO_LOG"
#: Seconds each demo task sleeps in its handler.
TASK_SLEEP_S = 0.02
#: Handler threads of the demo worker.
CONCURRENCY = 4
#: The demo gives up (and says so) after this long, plus the freeze.
TIME_LIMIT_S = 120.0
#: Longest wait for the worker subprocess to report READING.
WORKER_START_TIMEOUT_S = 20.0
#: Drain time passed to the worker; the demo stops it only once every task is done.
WORKER_DRAIN_S = 5.0
#: A worker that exits on its own is restarted at most this many times (each exit is counted).
MAX_RESTARTS = 3
#: Progress refresh: ~5 times a second on a terminal, once a second otherwise.
TTY_REFRESH_S = 0.2
PLAIN_REFRESH_S = 1.0
#: Main loop tick.
TICK_S = 0.05
#: Longest freeze the demo accepts (the server is SIGSTOPped for this long).
MAX_FREEZE_S = 60.0


def log_tail(path: Path, most: int = 8) -> list[str]:
    """The non-blank lines of a worker's log, the middle elided past ``most`` lines."""
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []
    lines = [ln for ln in lines if ln.strip()]
    if len(lines) > most:
        return [*lines[: most // 2], f"... ({len(lines) - most} more lines)", *lines[-(most // 2) :]]
    return lines


def delete_or_say(queue: StreamQueue, keys: list[str], say: Callable[[str], None]) -> bool:
    """Delete ``keys`` on ``queue``'s server; on a Redis failure say so instead of raising. True if deleted."""
    try:
        delete(queue, keys)
    except Exception as exc:
        if not is_redis_failure(exc):
            raise
        say(f"!! could not delete the demo keys ({type(exc).__name__}: {exc}); first key {keys[0]}")
        return False
    return True


def print_tally(rows: list[tuple[str, str]], notes: list[str], say: Callable[[str], None]) -> None:
    """The tally as aligned rows, then the workers' warnings and errors, if any."""
    say("")
    say("plaita demo: tally")
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        say(f"  {key:<{width}}  {value}")
    if notes:
        say("")
        say("worker log (warnings and errors):")
        for line in notes:
            say(f"  {line}")


class DemoError(PlaitaError):
    """Raised when the demo cannot go on; the message says why."""


def demo_handler(task: Task) -> None:
    """Sleep ``params.sleep_s`` (cancel-aware), then append ``<monotonic> <message id>`` to $PLAITA_DEMO_LOG.

    One O_APPEND write per completed execution, so the demo counts duplicates and losses
    exactly. A task whose lease was lost (``task.cancelled``) stops and records nothing.
    """
    params = task.body.get("params")
    sleep_s = float(params.get("sleep_s", TASK_SLEEP_S)) if isinstance(params, dict) else TASK_SLEEP_S
    if task.cancelled.wait(sleep_s):
        return
    line = f"{time.monotonic():.6f} {task.message_id} {task.delivery_count}\n"
    fd = os.open(os.environ[DEMO_LOG_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode("utf-8"))
    finally:
        os.close(fd)


@dataclass
class ExecutionLog:
    """Reads the handler's append-only log incrementally."""

    path: Path
    offset: int = 0
    executions: int = 0
    times_by_id: dict[str, list[float]] = field(default_factory=dict)

    def poll(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            return
        end = chunk.rfind(b"\n") + 1  # only whole lines
        self.offset += end
        for raw in chunk[:end].decode("utf-8", "replace").splitlines():
            parts = raw.split()
            if len(parts) >= 2:
                self.executions += 1
                self.times_by_id.setdefault(parts[1], []).append(float(parts[0]))

    @property
    def unique(self) -> int:
        return len(self.times_by_id)

    def first_after(self, t: float) -> float | None:
        later = [x for times in self.times_by_id.values() for x in times if x > t]
        return min(later) if later else None


class WorkerProcess:
    """``python -m plaita worker`` in its own session (a terminal Ctrl-C reaches only the demo)."""

    def __init__(self, args: list[str], env: dict[str, str], stderr_path: Path) -> None:
        self._stderr = open(stderr_path, "ab")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=self._stderr, env=env, start_new_session=True
        )

    def exited(self) -> int | None:
        return self.proc.poll()

    def stop(self, timeout_s: float) -> tuple[int, float]:
        """SIGTERM, wait ``timeout_s`` (then SIGKILL); returns (exit code, seconds to exit)."""
        started = time.monotonic()
        code = stop_process(self.proc, timeout_s)
        return code, time.monotonic() - started

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(5)
        finally:
            self._stderr.close()


@dataclass
class Freeze:
    """When Redis was frozen and thawed (monotonic seconds), and at what progress."""

    started_at: float | None = None
    ended_at: float | None = None
    at_done: int = 0

    def step(self, server: PrivateRedis, done: int, total: int, freeze_s: float, say: Callable[[str], None]) -> None:
        """Freeze ``server`` once a third of ``total`` is done; thaw it ``freeze_s`` later."""
        now = time.monotonic()
        if self.started_at is None and done >= max(1, total // 3):
            self.at_done = done
            server.freeze()
            self.started_at = now
            say(f"-- {done}/{total} done: freezing Redis (SIGSTOP) for {freeze_s:g} s")
        elif self.ended_at is None and self.started_at is not None and now - self.started_at >= freeze_s:
            server.thaw()
            self.ended_at = time.monotonic()
            say(f"-- thawed Redis (SIGCONT) after {self.seconds:.1f} s")

    def rows(self, log: ExecutionLog, tasks: int, *, own_server: bool) -> list[tuple[str, str]]:
        """The tally's rows about the freeze: how long, and how soon work resumed after the thaw."""
        if not own_server:
            return [("Redis frozen", "not frozen (--redis-url: the demo never freezes a server it did not start)")]
        if self.started_at is None:
            return [("Redis frozen", "never (the run ended before the freeze point)")]
        rows = [("Redis frozen", f"{self.seconds:.2f} s (SIGSTOP at {self.at_done}/{tasks} done)")]
        first = log.first_after(self.ended_at) if self.ended_at is not None else None
        recovery = "no task completed after the thaw" if first is None else (
            f"{first - (self.ended_at or 0.0):.2f} s from SIGCONT to the next completed task"
        )  # fmt: skip
        rows.append(("recovery", recovery))
        last = max((t for times in log.times_by_id.values() for t in times), default=None)
        if last is not None and self.ended_at is not None and last > self.ended_at:
            rows.append(("last task done", f"{last - self.ended_at:.2f} s after SIGCONT"))
        return rows

    @property
    def seconds(self) -> float:
        if self.started_at is None:
            return 0.0
        end = self.ended_at if self.ended_at is not None else time.monotonic()
        return end - self.started_at
