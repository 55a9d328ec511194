"""Workers, handlers and fault injection for the lease-aware delivery tests.

Leases are held while a task runs; reclaim takes only entries that are idle and unleased.

Subprocess workers run ``python -m plaita worker`` with ``count_first_sleep`` (below) so a
task can be long on its first execution and quick on a re-execution; in-process workers run
a ``Worker`` on a thread with a ``Probe`` handler. Fault injection wraps a real client
(``FlakySettleRedis``); nothing imitates Redis.
"""

from __future__ import annotations

import json
import os
import signal
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
from plaita.ops.status import read_status_file
from plaita.runtime.worker import Worker
from plaita.store.client import make_client
from plaita.store.streams.partitioned import open_queue
from plaita.tasks import Task

ROOT = Path(__file__).resolve().parent.parent.parent
QUEUE = "plaita:test:lease"
#: Flags of a worker that takes a dead one's executions over fast (the chaos and flow worker
#: tests): claimable after 0.5 s idle and a 2 s lease, a reclaim pass every 0.3 s.
FAST_RECLAIM_ARGS = (
    "--claim-min-idle-ms", "500",
    "--lease-ttl-seconds", "2",
    "--reclaim-interval-s", "0.3",
    "--read-block-ms", "200",
)  # fmt: skip
GROUP = "plaita-workers"

_clients: dict[str, redis.Redis] = {}


def wait_for(predicate: Callable[[], bool], timeout_s: float, what: str) -> float:
    """Poll ``predicate`` until true; returns the seconds waited, AssertionError after ``timeout_s``."""
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout_s:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.01)
    return time.monotonic() - started


# -- a handler for subprocess workers --------------------------------------------------


def server_client(url: str) -> redis.Redis:
    """A client of the test server (plaita's RedisCluster client for a ``redis+cluster://`` URL)."""
    if is_cluster_url(url):
        return make_client(url, socket_timeout_s=5.0)
    return redis.Redis.from_url(url, socket_timeout=5)


def count_first_sleep(task: Task) -> None:
    """Count executions in Redis; sleep ``params.first_sleep_s`` (cancel-aware) on the first only.

    Keys (``{id}`` = execution id): ``executions`` and ``completed`` counters as
    ``tests.support.handlers:count_in_redis``, plus ``cancelled`` (the handler saw its cancel
    flag and stopped) and the list ``deliveries`` (delivery count of every execution).
    """
    url = os.environ["PLAITA_TEST_REDIS_URL"]
    client = _clients.get(url)
    if client is None:
        client = _clients[url] = server_client(url)
    eid = task.execution_id
    n = int(client.incr(f"plaita:test:executions:{eid}"))  # type: ignore[arg-type]
    client.rpush(f"plaita:test:deliveries:{eid}", task.delivery_count)
    params = task.body.get("params") if isinstance(task.body.get("params"), dict) else {}
    if n == 1 and params.get("first_sleep_s"):
        task.cancelled.wait(float(params["first_sleep_s"]))
    if task.cancelled.is_set():
        client.incr(f"plaita:test:cancelled:{eid}")
        return
    client.incr(f"plaita:test:completed:{eid}")


def counter(client: redis.Redis, kind: str, execution_id: str) -> int:
    """``plaita:test:{kind}:{execution_id}`` as an int (0 when absent)."""
    value = client.get(f"plaita:test:{kind}:{execution_id}")
    return int(value) if value is not None else 0  # type: ignore[arg-type]


# -- subprocess workers -----------------------------------------------------------------


@dataclass
class WorkerProc:
    proc: subprocess.Popen[bytes]
    status_file: Path
    stderr_file: Path
    started_at_s: float

    def status(self) -> dict[str, Any]:
        return read_status_file(self.status_file) or {}

    def counters(self) -> dict[str, int]:
        return dict(self.status().get("counters") or {})

    def stderr(self) -> str:
        try:
            return self.stderr_file.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_reading(self, timeout_s: float = 30.0) -> None:
        def reading() -> bool:
            if not self.alive():
                raise AssertionError(f"worker exited with {self.proc.returncode}: {self.stderr()[-3000:]}")
            return self.status().get("state") == "READING"

        wait_for(reading, timeout_s, f"{self.status_file.name} READING")

    def kill9(self) -> float:
        """kill -9; returns time.monotonic() of the kill."""
        at = time.monotonic()
        self.proc.kill()
        self.proc.wait(5)
        return at

    def terminate(self, timeout_s: float = 10.0) -> int:
        self.proc.terminate()
        return self.proc.wait(timeout_s)


def worker_env(url: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["PLAITA_TEST_REDIS_URL"] = url
    for name in ("PLAITA_REDIS_URL", "REDIS_URL", "PLAITA_QUEUE_NAME", "QUEUE_NAME", "PLAITA_CONSUMER_NAME"):
        env.pop(name, None)
    return env


@contextmanager
def worker_proc(
    url: str,
    tmp_path: Path,
    consumer: str,
    *args: str,
    tag: str | None = None,
    handler: str = "tests.support.lease_workers:count_first_sleep",
    log_level: str = "INFO",
) -> Iterator[WorkerProc]:
    """``python -m plaita worker --consumer-name consumer``; killed afterwards if still alive."""
    tag = tag or consumer
    status_file = tmp_path / f"{tag}.status.json"
    stderr_file = tmp_path / f"{tag}.stderr"
    cmd = [
        sys.executable,
        "-m",
        "plaita",
        "--log-level",
        log_level,
        "worker",
        "--redis-url",
        url,
        "--queue-name",
        QUEUE,
        "--consumer-name",
        consumer,
        "--status-file",
        str(status_file),
        # A flow worker (or one with a keeper) runs no handler: the two are refused together.
        *(() if {"--flows", "--keeper"} & set(args) else ("--handler", handler)),
        *args,
    ]
    with open(stderr_file, "wb") as err:
        proc = subprocess.Popen(cmd, cwd=str(ROOT), env=worker_env(url), stdout=subprocess.DEVNULL, stderr=err)
    wp = WorkerProc(proc, status_file, stderr_file, time.monotonic())
    try:
        yield wp
    finally:
        if wp.alive():
            wp.proc.kill()
            wp.proc.wait(5)


# -- in-process workers -----------------------------------------------------------------


@dataclass
class Run:
    """One execution seen by a ``Probe``."""

    message_id: str
    execution_id: str
    delivery_count: int
    fencing_token: int
    started_at_s: float
    ended_at_s: float | None = None
    cancelled: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


class Probe:
    """An in-process handler recording every execution.

    Body ``params``: ``sleep_s`` (cancel-aware wait, every execution), ``first_sleep_s`` (only
    on the first execution of that execution id this probe sees; ``sleeps=False`` ignores
    both), ``fail`` (raise RuntimeError). ``hook`` (if
    set) runs after the wait with the task and its Run, before the handler returns.
    """

    def __init__(self, hook: Callable[[Task, Run], None] | None = None, *, sleeps: bool = True) -> None:
        self._cond = threading.Condition()
        self.sleeps = sleeps
        self.runs: list[Run] = []
        self.hook = hook

    def __call__(self, task: Task) -> None:
        params = task.body.get("params") if isinstance(task.body.get("params"), dict) else {}
        run = Run(task.message_id, task.execution_id, task.delivery_count, task.fencing_token, time.monotonic())
        with self._cond:
            first = not any(r.execution_id == task.execution_id for r in self.runs)
            self.runs.append(run)
            self._cond.notify_all()
        try:
            sleep_s = float(params.get("sleep_s") or 0) or (float(params.get("first_sleep_s") or 0) if first else 0)
            if sleep_s and self.sleeps:
                task.cancelled.wait(sleep_s)
            with self._cond:
                run.cancelled = task.cancelled.is_set()
                self._cond.notify_all()
            if self.hook is not None:
                self.hook(task, run)
            if params.get("fail"):
                raise RuntimeError(f"boom {params.get('n')}")
        finally:
            with self._cond:
                run.ended_at_s = time.monotonic()
                self._cond.notify_all()

    def snapshot(self) -> list[Run]:
        with self._cond:
            return list(self.runs)

    def wait(self, predicate: Callable[[list[Run]], bool], timeout_s: float, what: str) -> None:
        with self._cond:
            ok = self._cond.wait_for(lambda: predicate(self.runs), timeout_s)
            runs = list(self.runs)
        assert ok, f"timed out after {timeout_s} s waiting for {what}; runs: {runs}"


def settings(url: str, consumer: str, **overrides: Any) -> Settings:
    """Fast in-process worker settings on ``QUEUE``."""
    base: dict[str, Any] = {
        "redis_url": url,
        "queue_name": QUEUE,
        "consumer_name": consumer,
        "read_block_ms": 100,
        "concurrency": 1,
        "prefetch": 0,
        "drain_timeout_s": 5.0,
        "claim_min_idle_ms": 1000,
        "reclaim_interval_s": 0.5,
        "lease_ttl_s": 3.0,
        "backoff_base_s": 0.01,
        "backoff_cap_s": 0.05,
        "persistent_backoff_s": 0.1,
    }
    base.update(overrides)
    return Settings(**base)


def worker_client(url: str, settings_: Settings, cls: type[redis.Redis] = redis.Redis) -> redis.Redis:
    """A client configured as plaita's own (no hidden retries, worker socket timeout)."""
    return cls.from_url(
        url, socket_timeout=settings_.socket_timeout_s, socket_connect_timeout=2.0, retry=Retry(NoBackoff(), 0)
    )


@dataclass
class InProc:
    worker: Worker
    thread: threading.Thread
    result: dict[str, Any]

    def stop(self, *, now: bool = False, timeout_s: float = 10.0) -> float:
        """Request a stop and join; returns the seconds it took."""
        started = time.monotonic()
        self.worker.request_stop(now=now)
        self.thread.join(timeout_s)
        assert not self.thread.is_alive(), f"worker did not stop within {timeout_s} s"
        assert "exc" not in self.result, f"worker.run() raised {self.result['exc']!r}"
        return time.monotonic() - started


@contextmanager
def inproc_worker(
    settings_: Settings, handler: Callable[[Task], None], *, client: redis.Redis | None = None
) -> Iterator[InProc]:
    """Run a Worker on a thread (optionally over ``client``); always stopped at the end."""
    if is_cluster_url(settings_.redis_url):  # a RedisCluster: plaita's own construction
        q = open_queue(settings_, client=client)
    else:
        if client is None:
            client = worker_client(settings_.redis_url, settings_)
        q = open_queue(settings_, client=client, read_client=worker_client(settings_.redis_url, settings_))
    worker = Worker(settings_, handler, stream_queue=q)
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["rc"] = worker.run()
        except BaseException as exc:  # reported by InProc.stop
            result["exc"] = exc

    thread = threading.Thread(target=target, name=f"test-worker-{settings_.consumer_name}", daemon=True)
    thread.start()
    running = InProc(worker, thread, result)
    try:
        wait_for(lambda: worker.lifecycle.state.name == "READING", 5.0, "worker READING")
        yield running
    finally:
        if thread.is_alive():
            running.stop(now=True)


# -- fault injection on a real client ---------------------------------------------------


class _FlakyPipeline(redis.client.Pipeline):
    """A real pipeline; a MULTI/EXEC carrying an XACK raises ConnectionError while ``owner.fail_acks`` > 0."""

    owner: FlakySettleRedis

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        names = {str(args[0]).upper() for args, _options in self.command_stack}
        if self.transaction and "XACK" in names:
            with self.owner.lock:
                self.owner.ack_attempts += 1
                fail = self.owner.fail_acks > 0
                if fail:
                    self.owner.fail_acks -= 1
            if fail:
                self.reset()
                raise redis.ConnectionError("injected: settle transaction lost before it reached Redis")
        return super().execute(raise_on_error)


class FlakySettleRedis(redis.Redis):
    """A real client whose next ``fail_acks`` settle transactions (MULTI/EXEC with XACK) fail."""

    fail_acks = 0
    ack_attempts = 0
    lock = threading.Lock()

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> _FlakyPipeline:
        pipe = _FlakyPipeline(self.connection_pool, self.response_callbacks, transaction, shard_hint)
        pipe.owner = self
        return pipe


def enqueue(client: redis.Redis, body: dict[str, Any]) -> str:
    """XADD one task body the way producers do."""
    mid = client.xadd(QUEUE, {"payload": json.dumps(body), "schema_version": "1"})
    return mid.decode() if isinstance(mid, bytes) else str(mid)


def pending_count(client: redis.Redis) -> int:
    try:
        info = client.xpending(QUEUE, GROUP)
    except redis.ResponseError:
        return 0
    return int(info["pending"])


@contextmanager
def keeper_proc(url: str, tmp_path: Path, tag: str, *args: str) -> Iterator[subprocess.Popen[bytes]]:
    """``plaita keeper`` on QUEUE with ``args``, its stderr in ``tmp_path/<tag>.stderr``; SIGTERM
    (then kill) on exit, so its return code is set afterwards."""
    cmd = [sys.executable, "-m", "plaita", "keeper", "--redis-url", url, "--queue-name", QUEUE, *args]
    with open(tmp_path / f"{tag}.stderr", "wb") as err:
        proc = subprocess.Popen(cmd, cwd=str(ROOT), env=worker_env(url), stdout=subprocess.DEVNULL, stderr=err)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
