"""In-process and subprocess workers for the real-Redis tier, plus exact fault injection.

Fault injection wraps a real redis client: ``FaultyRedis`` is a ``redis.Redis`` whose named
call sites raise a planned exception (once, or ``times`` times) and otherwise delegate to the
real server. Nothing here imitates Redis semantics.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
import redis.client
from redis.backoff import NoBackoff
from redis.retry import Retry

from plaita.config import Settings, is_cluster_url
from plaita.errors import BadTaskError
from plaita.fsm import State
from plaita.ops.status import read_status_file
from plaita.runtime.worker import Worker
from plaita.store.scripts import SCRIPTS
from plaita.store.streams.partitioned import open_queue
from plaita.tasks import Task

ROOT = Path(__file__).resolve().parent.parent.parent

#: Call sites a FaultPlan can hit. ``xreadgroup_new`` is ``XREADGROUP … >`` (read_new) only;
#: ``reclaim`` is whatever claims other consumers' entries: XAUTOCLAIM, XCLAIM (not JUSTID) or a
#: Lua script doing either (StreamQueue.claim_unleased); ``xack`` is any pipeline
#: that carries an XACK (StreamQueue.settle).
#: CLIENT SETNAME of the in-process worker's blocking-read connection (CLIENT LIST shows it).
READ_CLIENT_NAME = "plaita-test-reader"
SITES = ("xgroup_create", "xreadgroup_new", "xreadgroup_own", "reclaim", "xack")


def _is_reclaim_script(text: str) -> bool:
    upper = text.upper()
    return "XAUTOCLAIM" in upper or ("XCLAIM" in upper and "JUSTID" not in upper)


def wait_for(predicate: Callable[[], bool], timeout_s: float = 5.0, what: str = "condition") -> None:
    """Poll ``predicate`` until true; AssertionError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.005)


@dataclass
class Fault:
    exc: BaseException
    times: int = 1
    #: True: issue the real command first, then raise (the reply was lost in transit).
    after_call: bool = False
    #: With ``after_call``: only a reply that carried stream entries is lost (others pass).
    only_with_entries: bool = False


class FaultPlan:
    """Which site raises what; thread-safe; counts calls and raises per site."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._faults: dict[str, Fault] = {}
        self.calls: dict[str, int] = dict.fromkeys(SITES, 0)
        #: sha1 -> site, for Lua scripts registered through a FaultyRedis.
        self.script_sites: dict[str, str] = {}
        self.raised: dict[str, int] = dict.fromkeys(SITES, 0)
        self._delays_s: dict[str, float] = {}

    def arm(
        self,
        site: str,
        exc: BaseException,
        *,
        times: int = 1,
        after_call: bool = False,
        only_with_entries: bool = False,
    ) -> None:
        assert site in SITES, site
        with self._lock:
            self._faults[site] = Fault(exc, times, after_call, only_with_entries)

    def disarm(self, site: str) -> None:
        with self._lock:
            self._faults.pop(site, None)

    def slow(self, site: str, delay_s: float) -> None:
        """Make every call at ``site`` take ``delay_s`` longer (a slow round trip, not an error)."""
        with self._lock:
            self._delays_s[site] = delay_s

    def delay_s(self, site: str) -> float:
        with self._lock:
            return self._delays_s.get(site, 0.0)

    def peek(self, site: str) -> Fault | None:
        """Count one call at ``site``; the fault armed there, if any (not consumed yet)."""
        with self._lock:
            self.calls[site] += 1
            return self._faults.get(site)

    def consume(self, site: str, fault: Fault) -> None:
        with self._lock:
            fault.times -= 1
            if fault.times <= 0 and self._faults.get(site) is fault:
                del self._faults[site]
            self.raised[site] += 1


def _run_site(plan: FaultPlan, site: str, call: Callable[[], Any]) -> Any:
    delay_s = plan.delay_s(site)
    if delay_s > 0:
        time.sleep(delay_s)  # injected latency of this round trip
    fault = plan.peek(site)
    if fault is None:
        return call()
    if fault.after_call:
        reply = call()
        if fault.only_with_entries and not reply:
            return reply
    plan.consume(site, fault)
    raise fault.exc


class FaultyPipeline(redis.client.Pipeline):
    """A real pipeline whose ``execute`` consults the plan when it carries an XACK."""

    plan: FaultPlan

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        names = {str(args[0]).upper() for args, _options in self.command_stack}
        if "XACK" in names:
            return _run_site(self.plan, "xack", lambda: super(FaultyPipeline, self).execute(raise_on_error))
        return super().execute(raise_on_error)


class FaultyRedis(redis.Redis):
    """A real client whose stream call sites may raise a planned exception."""

    plan: FaultPlan

    @classmethod
    def connect(
        cls, url: str, plan: FaultPlan, *, socket_timeout_s: float = 5.0, client_name: str | None = None
    ) -> FaultyRedis:
        client = cls.from_url(
            url,
            socket_timeout=socket_timeout_s,
            socket_connect_timeout=2.0,
            retry=Retry(NoBackoff(), 0),
            client_name=client_name,
        )
        client.plan = plan
        # plaita runs every Lua script by SHA from one registry (plaita.store.scripts).
        for script in SCRIPTS.values():
            if _is_reclaim_script(script.source):
                plan.script_sites[script.sha] = "reclaim"
        return client

    def xgroup_create(self, *args: Any, **kwargs: Any) -> Any:
        return _run_site(self.plan, "xgroup_create", lambda: super(FaultyRedis, self).xgroup_create(*args, **kwargs))

    def xreadgroup(self, groupname: Any, consumername: Any, streams: Any, *args: Any, **kwargs: Any) -> Any:
        site = "xreadgroup_new" if ">" in dict(streams).values() else "xreadgroup_own"
        real = super()

        return _run_site(self.plan, site, lambda: real.xreadgroup(groupname, consumername, streams, *args, **kwargs))

    def xautoclaim(self, *args: Any, **kwargs: Any) -> Any:
        return _run_site(self.plan, "reclaim", lambda: super(FaultyRedis, self).xautoclaim(*args, **kwargs))

    def xclaim(self, *args: Any, **kwargs: Any) -> Any:
        call = lambda: super(FaultyRedis, self).xclaim(*args, **kwargs)  # noqa: E731
        return call() if kwargs.get("justid") else _run_site(self.plan, "reclaim", call)

    def evalsha(self, sha: str, numkeys: int, *args: Any) -> Any:
        site = self.plan.script_sites.get(sha)
        call = lambda: super(FaultyRedis, self).evalsha(sha, numkeys, *args)  # noqa: E731
        return call() if site is None else _run_site(self.plan, site, call)

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> FaultyPipeline:
        pipe = FaultyPipeline(self.connection_pool, self.response_callbacks, transaction, shard_hint)
        pipe.plan = self.plan
        return pipe


@dataclass
class Execution:
    message_id: str
    n: Any
    delivery_count: int


class Recorder:
    """A thread-safe handler recording every execution; ``params`` drive failures."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.executions: list[Execution] = []

    def __call__(self, task: Task) -> None:
        params = task.body.get("params") if isinstance(task.body.get("params"), dict) else {}
        with self._cond:
            self.executions.append(Execution(task.message_id, params.get("n"), task.delivery_count))
            self._cond.notify_all()
        if params.get("bad"):
            raise BadTaskError("handler says bad input")
        if params.get("fail"):
            raise RuntimeError(f"boom {params.get('n')}")

    def ids(self) -> list[str]:
        with self._cond:
            return [e.message_id for e in self.executions]

    def count(self) -> int:
        with self._cond:
            return len(self.executions)

    def reset(self) -> None:
        """Forget the executions seen so far."""
        with self._cond:
            self.executions.clear()

    def wait_count(self, n: int, timeout_s: float = 5.0) -> None:
        with self._cond:
            ok = self._cond.wait_for(lambda: len(self.executions) >= n, timeout_s)
        assert ok, f"expected {n} executions within {timeout_s} s, saw {self.count()}: {self.executions}"


class ObservedWorker(Worker):
    """A Worker whose transitions are recorded; ``on_backoff`` runs on entering BACKOFF."""

    def __init__(self, *args: Any, on_backoff: Callable[[], Any] | None = None, **kwargs: Any) -> None:
        self.transitions: list[tuple[State, State, str]] = []
        self._transition_cond = threading.Condition()
        self._on_backoff = on_backoff
        self.backoff_snapshots: list[Any] = []
        super().__init__(*args, **kwargs)

    def _on_transition(self, source: State, dest: State, trigger: str) -> None:
        if dest is State.BACKOFF and self._on_backoff is not None:
            self.backoff_snapshots.append(self._on_backoff())
        with self._transition_cond:
            self.transitions.append((source, dest, trigger))
            self._transition_cond.notify_all()
        super()._on_transition(source, dest, trigger)

    def entered(self, state: State) -> int:
        """How many times ``state`` was entered so far."""
        with self._transition_cond:
            return self._entered(state)

    def _entered(self, state: State) -> int:
        return sum(1 for _s, d, _t in self.transitions if d is state)

    def wait_entered(self, state: State, times: int = 1, timeout_s: float = 5.0) -> None:
        with self._transition_cond:
            ok = self._transition_cond.wait_for(lambda: self._entered(state) >= times, timeout_s)
        assert ok, f"{state.name} not entered {times}x within {timeout_s} s: {self.transitions}"

    def wait_reading_after_backoff(self, backoffs: int = 1, timeout_s: float = 5.0) -> None:
        """Wait until BACKOFF was entered ``backoffs`` times and READING was entered after the last."""

        def done() -> bool:
            seen = 0
            for _s, d, _t in self.transitions:
                if d is State.BACKOFF:
                    seen += 1
                elif d is State.READING and seen >= backoffs:
                    return True
            return False

        with self._transition_cond:
            ok = self._transition_cond.wait_for(done, timeout_s)
        assert ok, f"no READING after {backoffs} BACKOFF(s) within {timeout_s} s: {self.transitions}"


def fast_settings(url: str, **overrides: Any) -> Settings:
    """Settings for a fast in-process worker on the private server."""
    base: dict[str, Any] = {
        "redis_url": url,
        "queue_name": "plaita:test:queue",
        "consumer_name": "test-host:0",
        "read_block_ms": 100,
        "concurrency": 1,
        "prefetch": 0,
        "drain_timeout_s": 2.0,
        "backoff_base_s": 0.01,
        "backoff_cap_s": 0.05,
        "persistent_backoff_s": 0.1,
    }
    base.update(overrides)
    return Settings(**base)


@dataclass
class RunningWorker:
    worker: ObservedWorker
    thread: threading.Thread
    plan: FaultPlan
    recorder: Recorder
    settings: Settings
    result: dict[str, Any] = field(default_factory=dict)

    @property
    def alive(self) -> bool:
        return self.thread.is_alive()


@contextmanager
def running_worker(
    url: str,
    *,
    plan: FaultPlan | None = None,
    recorder: Recorder | None = None,
    on_backoff: Callable[[], Any] | None = None,
    wait_reading: bool = True,
    **overrides: Any,
) -> Iterator[RunningWorker]:
    """Run an ObservedWorker on a thread over FaultyRedis clients; always stop and join it."""
    plan = plan if plan is not None else FaultPlan()
    recorder = recorder if recorder is not None else Recorder()
    settings = fast_settings(url, **overrides)
    if is_cluster_url(url):  # plaita's own RedisCluster clients (the fault plan applies to one server only)
        q = open_queue(settings)
    else:
        client = FaultyRedis.connect(url, plan, socket_timeout_s=settings.socket_timeout_s)
        read_client = FaultyRedis.connect(
            url, plan, socket_timeout_s=settings.socket_timeout_s, client_name=READ_CLIENT_NAME
        )
        q = open_queue(settings, client=client, read_client=read_client)
    worker = ObservedWorker(settings, recorder, stream_queue=q, on_backoff=on_backoff)
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["rc"] = worker.run()
        except BaseException as exc:  # recorded so the test can fail with it
            result["exc"] = exc

    thread = threading.Thread(target=target, name="test-worker-owner", daemon=True)
    thread.start()
    running = RunningWorker(worker, thread, plan, recorder, settings, result)
    try:
        if wait_reading:
            worker.wait_entered(State.READING)
        yield running
    finally:
        worker.request_stop(now=True)
        thread.join(5.0)
    assert not thread.is_alive(), "worker thread did not stop within 5 s"
    assert "exc" not in result, f"worker.run() raised {result.get('exc')!r}"
    assert result.get("rc") == 0


# -- subprocess workers -------------------------------------------------------------------


def worker_env(log_path: Path, url: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["PLAITA_TEST_LOG"] = str(log_path)
    env["PLAITA_TEST_REDIS_URL"] = url
    for name in ("PLAITA_REDIS_URL", "REDIS_URL", "PLAITA_QUEUE_NAME", "QUEUE_NAME"):
        env.pop(name, None)
    return env


@dataclass
class WorkerProcess:
    proc: subprocess.Popen[bytes]
    status_file: Path
    stderr_file: Path

    def status(self) -> dict[str, Any] | None:
        return read_status_file(self.status_file)

    def wait_state(self, state: str, timeout_s: float = 10.0) -> None:
        def reached() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"worker exited with {self.proc.returncode}: {self.stderr()}")
            st = self.status()
            return st is not None and st.get("state") == state

        wait_for(reached, timeout_s, f"worker state {state}")

    def signal_and_time(self, sig: int, timeout_s: float = 10.0) -> tuple[int, float]:
        """Send ``sig``; return (exit code, seconds from kill to exit)."""
        started = time.monotonic()
        os.kill(self.proc.pid, sig)
        rc = self.proc.wait(timeout_s)
        return rc, time.monotonic() - started

    def stderr(self) -> str:
        try:
            return self.stderr_file.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)


@contextmanager
def worker_process(url: str, tmp_path: Path, *args: str, name: str = "w") -> Iterator[WorkerProcess]:
    """``python -m plaita worker`` on the private server; killed if still running afterwards."""
    status_file = tmp_path / f"{name}.status.json"
    stderr_file = tmp_path / f"{name}.stderr"
    log_path = tmp_path / f"{name}.log"
    cmd = [
        sys.executable,
        "-m",
        "plaita",
        "worker",
        "--redis-url",
        url,
        "--queue-name",
        "plaita:test:queue",
        "--consumer-name",
        f"{name}-host:0",
        "--status-file",
        str(status_file),
        # A worker must name what it runs; these tests use the logging one unless they choose.
        *(() if {"--handler", "--flows", "--keeper"} & set(args) else ("--handler", "plaita.runtime.handlers:echo")),
        *args,
    ]
    with open(stderr_file, "wb") as err:
        proc = subprocess.Popen(
            cmd, cwd=str(ROOT), env=worker_env(log_path, url), stdout=subprocess.DEVNULL, stderr=err
        )
    wp = WorkerProcess(proc, status_file, stderr_file)
    try:
        yield wp
    finally:
        wp.kill()


def run_cli(*args: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run ``python -m plaita …`` to completion (config errors never touch Redis)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, "-m", "plaita", *args],
        cwd=str(ROOT),
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


__all__ = [
    "FaultPlan",
    "FaultyRedis",
    "ObservedWorker",
    "Recorder",
    "running_worker",
    "run_cli",
    "fast_settings",
    "wait_for",
    "worker_process",
]
