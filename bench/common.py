"""Shared pieces: payloads, bulk enqueue, a producer thread, the handler log, subprocesses that
are always reaped, /proc readings, a progress line and small statistics."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from plaita.ops.status import read_status_file
from plaita.store.server import stop_process

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

#: Entries per XADD pipeline when pre-enqueueing.
ENQUEUE_CHUNK = 1000
#: Longest wait for a worker subprocess to reach a state (python start-up included).
WORKER_START_TIMEOUT_S = 20.0
#: Environment variable naming the file ``bench.handlers:record`` appends to.
LOG_ENV = "PLAITA_BENCH_LOG"


def body(i: int, **params: Any) -> dict[str, Any]:
    """The task body every benchmark uses (same shape as ``plaita enqueue``); ``params.n`` = sequence number."""
    return {"type": "start", "flow_id": "bench", "params": {"n": i, **params}}


def fields(i: int, **params: Any) -> dict[str, str]:
    """Stream entry fields exactly as plaita writes them."""
    return {"payload": json.dumps(body(i, **params), separators=(",", ":")), "schema_version": "1"}


def execution_fields(i: int) -> dict[str, str]:
    """Fields of a task that names its execution (``execution_id``): the worker leases it before it runs."""
    payload = {"type": "start", "flow_id": "bench", "execution_id": f"bench-exec-{i}", "params": {"n": i}}
    return {"payload": json.dumps(payload, separators=(",", ":")), "schema_version": "1"}


def enqueue(
    client: redis.Redis, stream: str, count: int, *, start: int = 0, atomic: bool = False, execution_ids: bool = False
) -> None:
    """XADD ``count`` tasks; ``atomic`` = one MULTI/EXEC so consumers see all of them at once."""
    make = execution_fields if execution_ids else fields
    if atomic:
        pipe = client.pipeline(transaction=True)
        for i in range(start, start + count):
            pipe.xadd(stream, make(i))  # type: ignore[arg-type]
        pipe.execute()
        return
    for lo in range(start, start + count, ENQUEUE_CHUNK):
        pipe = client.pipeline(transaction=False)
        for i in range(lo, min(lo + ENQUEUE_CHUNK, start + count)):
            pipe.xadd(stream, make(i))  # type: ignore[arg-type]
        pipe.execute()


def group_pending(client: redis.Redis, stream: str, group: str) -> int:
    """PEL size of ``group`` on ``stream`` (0 when the group does not exist yet)."""
    try:
        groups = client.xinfo_groups(stream)
    except redis.ResponseError:
        return 0
    for g in groups:
        name = g.get("name")
        if (name.decode() if isinstance(name, bytes) else name) == group:
            return int(g.get("pending") or 0)
    return 0


def wait_for(predicate: Callable[[], bool], timeout_s: float, poll_s: float = 0.005) -> bool:
    """Poll ``predicate`` until true or ``timeout_s``; returns whether it became true."""
    deadline = time.monotonic() + timeout_s
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)


def scan_calls(client: redis.Redis) -> int:
    """SCAN calls the server ran since its stats were last reset (``INFO commandstats``)."""
    return int(client.info("commandstats").get("cmdstat_scan", {}).get("calls", 0))


def wait_fleet_checked(client: redis.Redis, workers: int, scans_before: int, timeout_s: float = 5.0) -> bool:
    """Wait until ``workers`` freshly started workers ran their first fleet check (``plaita.ops.fleetcheck``,
    ~1 s after start): at least two SCANs each (the registry and the stray-stream lookups), over a
    keyspace still nearly empty. Measured without this wait, that check lands inside a leased run and
    SCANs every fence key the run has written (0.4-1 us of redis-server CPU per task, a pause of the
    server's other work while it runs) although it runs once a minute, never once per second of work."""
    return wait_for(lambda: scan_calls(client) >= scans_before + 2 * workers, timeout_s)


def exit_on_sigterm() -> None:
    """SIGTERM raises SystemExit(143), so every ``finally`` stops the servers and workers it started."""

    def on_term(_signum: int, _frame: object) -> None:
        raise SystemExit(143)

    signal.signal(signal.SIGTERM, on_term)


def client_for(url: str, *, socket_timeout_s: float = 10.0) -> redis.Redis:
    """A bench-side client with no hidden retries (a retried XADD could enqueue twice)."""
    return redis.Redis.from_url(
        url, socket_timeout=socket_timeout_s, socket_connect_timeout=1.0, retry=Retry(NoBackoff(), 0)
    )


# -- subprocesses ------------------------------------------------------------------------


class Subprocess:
    """A child in its own session with stderr in a temp file; ``close()`` always reaps it."""

    def __init__(
        self, args: list[str], *, env: dict[str, str] | None = None, prefix: str = "plaita-bench-", cwd: Path = ROOT
    ) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix=prefix))
        self.stderr_path = self.dir / "stderr.log"
        full_env = dict(os.environ)
        full_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), full_env.get("PYTHONPATH", "")) if p)
        full_env.update(env or {})
        self._stderr = open(self.stderr_path, "wb")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=self._stderr, env=full_env, cwd=cwd, start_new_session=True
        )
        self.pid = self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stderr_tail(self, chars: int = 800) -> str:
        try:
            return self.stderr_path.read_text(encoding="utf-8", errors="replace")[-chars:]
        except OSError:
            return ""

    def terminate(self, timeout_s: float = 10.0) -> int:
        """SIGTERM and wait; SIGKILL past ``timeout_s``. Returns the exit code."""
        return stop_process(self.proc, timeout_s)

    def kill9(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(5)
        finally:
            self._stderr.close()
            for p in self.dir.iterdir():
                p.unlink(missing_ok=True)
            self.dir.rmdir()

    def __enter__(self) -> Subprocess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class WorkerProcess(Subprocess):
    """``python -m plaita worker`` as a subprocess with a status file."""

    def __init__(
        self,
        redis_url: str,
        *,
        stream: str,
        group: str,
        handler: str = "plaita.runtime.handlers:noop",
        consumer_name: str | None = None,
        extra_args: list[str] | None = None,
        env: dict[str, str] | None = None,
        wrapper: str | None = None,
        cwd: Path = ROOT,
        prefix: list[str] | None = None,
    ) -> None:
        """``wrapper``: a module running ``plaita`` (``python -m WRAPPER plaita …``, e.g. the round
        trip counter ``bench.countrt``); ``cwd``: where ``python -m`` finds ``plaita`` first;
        ``prefix``: a command the interpreter runs under (``valgrind --tool=callgrind …``)."""
        self.consumer_name = consumer_name or f"bench-{os.getpid()}-{time.monotonic_ns()}"
        status_dir = Path(tempfile.mkdtemp(prefix="plaita-bench-status-"))
        self.status_path = status_dir / "status.json"
        args = [
            *(prefix or []),
            sys.executable,
            "-m",
            *([wrapper] if wrapper else []),
            "plaita",
            "--log-level",
            "WARNING",
            "worker",
            "--redis-url",
            redis_url,
            "--queue-name",
            stream,
            "--consumer-group",
            group,
            "--consumer-name",
            self.consumer_name,
            # A flow worker (or one with a keeper) runs no handler: the two are refused together.
            *(() if {"--flows", "--keeper"} & set(extra_args or []) else ("--handler", handler)),
            "--status-file",
            str(self.status_path),
            *(extra_args or []),
        ]
        super().__init__(args, env=env, prefix="plaita-bench-worker-", cwd=cwd)
        self._status_dir = status_dir

    def status(self) -> dict[str, Any] | None:
        return read_status_file(self.status_path)

    def state(self) -> str | None:
        st = self.status()
        return None if st is None else str(st.get("state"))

    def counter(self, name: str) -> int:
        st = self.status() or {}
        counters = st.get("counters") or {}
        return int(counters.get(name, 0)) if isinstance(counters, dict) else 0

    def wait_state(self, state: str, timeout_s: float = WORKER_START_TIMEOUT_S, poll_s: float = 0.005) -> None:
        """Poll the status file until the worker reports ``state``; RuntimeError on exit or deadline."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker exited with {self.proc.returncode} before {state}: {self.stderr_tail()}")
            if self.state() == state:
                return
            time.sleep(poll_s)
        raise RuntimeError(f"worker not {state} after {timeout_s} s (last {self.state()}): {self.stderr_tail()}")

    def close(self) -> None:
        try:
            super().close()
        finally:
            # Whatever the worker left there (a status file's temporary twin, written as it was
            # stopped): the folder is the bench's own.
            shutil.rmtree(self._status_dir, ignore_errors=True)

    def __enter__(self) -> WorkerProcess:
        return self


def recording_worker(url: str, stream: str, group: str, name: str, log: HandlerLog, concurrency: int) -> WorkerProcess:
    """A worker whose handler (``bench.handlers:record``) writes each task it runs to ``log``."""
    return WorkerProcess(
        url,
        stream=stream,
        group=group,
        consumer_name=name,
        handler="bench.handlers:record",
        extra_args=["--concurrency", str(concurrency)],
        env={LOG_ENV: str(log.path)},
    )


def start_all(workers: list[WorkerProcess], state: str = "READING") -> None:
    """Wait until every worker reports ``state`` (they start in parallel)."""
    for w in workers:
        w.wait_state(state)


# -- /proc -------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` (all its threads) in seconds, from /proc/<pid>/stat."""
    text = Path(f"/proc/{pid}/stat").read_text()
    rest = text[text.rindex(")") + 2 :].split()  # fields from 3 (state) on
    ticks = int(rest[11]) + int(rest[12])  # fields 14 and 15
    return ticks / os.sysconf("SC_CLK_TCK")


def status_kb(pid: int, key: str) -> int:
    """A ``kB`` line of /proc/<pid>/status (e.g. VmHWM, VmRSS)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


# -- the handler log ------------------------------------------------------------------------


@dataclass(frozen=True)
class Event:
    """One line of ``bench.handlers:record``: S = started, E = finished, C = cancelled."""

    kind: str
    mono: float
    wall: float
    message_id: str
    n: int
    delivery: int
    pid: int
    enqueued_wall: float


@dataclass
class HandlerLog:
    """Reads the append-only handler log incrementally."""

    path: Path
    offset: int = 0
    events: list[Event] = field(default_factory=list)

    def poll(self) -> list[Event]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        end = chunk.rfind(b"\n") + 1
        self.offset += end
        new = []
        for raw in chunk[:end].decode("utf-8", "replace").splitlines():
            p = raw.split()
            if len(p) == 8:
                new.append(Event(p[0], float(p[1]), float(p[2]), p[3], int(p[4]), int(p[5]), int(p[6]), float(p[7])))
        self.events.extend(new)
        return new

    def of(self, kind: str) -> list[Event]:
        return [e for e in self.events if e.kind == kind]

    def finished_ns(self) -> set[int]:
        return {e.n for e in self.events if e.kind == "E"}

    def all_finished(self, ns: set[int]) -> bool:
        """Poll, then: has every task in ``ns`` finished (an ``E`` line)?"""
        self.poll()
        return ns <= self.finished_ns()

    def duplicates(self) -> int:
        """Finished executions beyond one per task."""
        finished = [e.n for e in self.events if e.kind == "E"]
        return len(finished) - len(set(finished))


# -- a producer thread --------------------------------------------------------------------


class Producer:
    """XADDs task ``n`` = 0, 1, ... at ``rate_per_s`` on its own thread, no catch-up after a stall.

    ``acked`` maps n to the message id Redis confirmed; an XADD that raised goes to
    ``uncertain`` (it may or may not have landed) and the producer carries on at the next tick.
    The body carries ``t`` = time.time() just before the XADD (for end-to-end latency).
    """

    def __init__(
        self,
        url: str,
        stream: str,
        rate_per_s: float,
        *,
        max_s: float,
        socket_timeout_s: float = 60.0,
        params: dict[str, Any] | None = None,
        start_n: int = 0,
    ) -> None:
        self._client = client_for(url, socket_timeout_s=socket_timeout_s)
        self._stream = stream
        self._every_s = 1.0 / rate_per_s
        self._max_s = max_s
        self._params = dict(params or {})
        self._next_n = start_n
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.acked: dict[int, str] = {}
        self.uncertain: set[int] = set()
        self.errors = 0
        self._thread = threading.Thread(target=self._run, name="bench-producer", daemon=True)

    def start(self) -> Producer:
        self._thread.start()
        return self

    def _run(self) -> None:
        next_at = time.monotonic()
        end = next_at + self._max_s
        while not self._stop.is_set() and time.monotonic() < end:
            n = self._next_n
            self._next_n += 1
            try:
                mid = self._client.xadd(self._stream, fields(n, t=time.time(), **self._params))  # type: ignore[arg-type]
                with self._lock:
                    self.acked[n] = mid.decode() if isinstance(mid, bytes) else str(mid)
            except redis.RedisError:
                with self._lock:
                    self.uncertain.add(n)
                    self.errors += 1
            next_at = max(next_at + self._every_s, time.monotonic())
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def acked_ns(self) -> set[int]:
        with self._lock:
            return set(self.acked)

    def stop(self, timeout_s: float = 70.0) -> None:
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(timeout_s)

    def close(self) -> None:
        self.stop()
        self._client.close()


# -- progress -----------------------------------------------------------------------------


class Progress:
    """A progress line: rewritten with \\r on a terminal, one line per step otherwise."""

    def __init__(self, label: str, total: int, *, out: TextIO | None = None) -> None:
        self.label = label
        self.total = max(1, total)
        self.done = 0
        self.out = out or sys.stdout
        self.tty = self.out.isatty()
        self.started = time.monotonic()
        self._width = 0

    def step(self, n: int = 1, note: str = "") -> None:
        self.done = min(self.total, self.done + n)
        self._show(note)

    def _show(self, note: str) -> None:
        elapsed = time.monotonic() - self.started
        frac = self.done / self.total
        eta = f", ~{elapsed / frac - elapsed:.0f} s left" if 0 < frac < 1 else ""
        filled = int(frac * 20)
        line = f"  {self.label} [{'#' * filled}{'.' * (20 - filled)}] {self.done}/{self.total} {elapsed:.0f} s{eta}"
        if note:
            line += f"  {note}"
        if self.tty:
            self.out.write("\r" + line + " " * max(0, self._width - len(line)))
            self._width = len(line)
        else:
            self.out.write(line + "\n")
        self.out.flush()

    def finish(self, note: str = "") -> None:
        if self.tty:
            self._show(note)
            self.out.write("\n")
        elif note:
            self.out.write(f"  {self.label}: {note}\n")
        self.out.flush()


# -- statistics ---------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    s = sorted(values)
    k = max(0, min(len(s) - 1, int(-(-q * len(s) // 100)) - 1))
    return s[k]


def median(values: list[float]) -> float:
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2
