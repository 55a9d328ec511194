"""Async handlers on one event loop (``AsyncHandlerPool``), on a real private Redis.

Overlap is measured from the monotonic start and end times each coroutine records, never
inferred from sleeps; waits are polls with deadlines.
"""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from plaita.errors import BadTaskError
from plaita.runtime.aio_pool import AsyncHandlerPool, is_async_handler
from plaita.runtime.pool import HandlerPool
from plaita.store.keyspace import DEFAULT
from plaita.tasks import Task
from tests.support.async_handlers import wait_cancelled
from tests.support.handlers import read_log
from tests.support.lease_workers import QUEUE, enqueue, inproc_worker, pending_count, settings, wait_for
from tests.support.workers import worker_process

pytestmark = pytest.mark.redis

GROUP = "plaita-workers"


@dataclass
class Span:
    n: int
    delivery: int
    thread: int
    started_s: float
    ended_s: float = 0.0
    cancelled: bool = False


class AsyncProbe:
    """An ``async def __call__`` handler recording a span per run; ``params`` drive it:
    ``sleep_s`` (cancel-aware wait on the loop), ``fail`` (RuntimeError), ``exit`` (SystemExit),
    ``bad`` (BadTaskError), ``until_cancelled`` (wait up to 10 s for the cancel flag)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.spans: list[Span] = []

    async def __call__(self, task: Task) -> None:
        params = task.body.get("params") or {}
        span = Span(int(params.get("n", 0)), task.delivery_count, threading.get_ident(), time.monotonic())
        with self.lock:
            self.spans.append(span)
        try:
            if params.get("until_cancelled"):
                span.cancelled = await wait_cancelled(task, 10.0)
            else:
                await asyncio.sleep(float(params.get("sleep_s", 0)))
            if params.get("exit"):
                raise SystemExit(3)
            if params.get("bad"):
                raise BadTaskError("handler says bad input")
            if params.get("fail"):
                raise RuntimeError(f"boom {params.get('n')}")
        finally:
            span.ended_s = time.monotonic()

    def finished(self) -> list[Span]:
        with self.lock:
            return [s for s in self.spans if s.ended_s]


def body(n: int, **params: object) -> dict[str, object]:
    return {"type": "start", "flow_id": "f", "params": {"n": n, **params}}


def max_overlap(spans: list[Span]) -> int:
    """Most spans open at one instant (an end at t closes before a start at t opens)."""
    events = sorted([(s.started_s, 1) for s in spans] + [(s.ended_s, -1) for s in spans], key=lambda e: (e[0], e[1]))
    most = now = 0
    for _t, step in events:
        now += step
        most = max(most, now)
    return most


def test_async_handlers_are_detected() -> None:
    async def fn(task: Task) -> None: ...

    def sync(task: Task) -> None: ...

    assert is_async_handler(fn) and is_async_handler(AsyncProbe()) and is_async_handler(AsyncProbe().__call__)
    assert not is_async_handler(sync) and not is_async_handler(len)


def test_concurrency_4_coroutines_overlap_on_one_thread(redis_url: str, bclient: redis.Redis) -> None:
    """12 tasks of 0.3 s with concurrency 4: at most 4 and at least 3 run at once, all on one thread."""
    probe = AsyncProbe()
    with inproc_worker(settings(redis_url, "aio", concurrency=4), probe) as w:
        assert isinstance(w.worker.pool, AsyncHandlerPool)
        for n in range(12):
            enqueue(bclient, body(n, sleep_s=0.3))
        wait_for(lambda: len(probe.finished()) == 12, 20.0, "12 tasks finished")
        wait_for(lambda: pending_count(bclient) == 0, 5.0, "all acked")
        assert w.worker.counters.completed == 12
    spans = probe.finished()
    assert sorted(s.n for s in spans) == list(range(12))
    assert 3 <= max_overlap(spans) <= 4, [(s.started_s, s.ended_s) for s in spans]
    assert len({s.thread for s in spans}) == 1
    assert spans[0].thread != threading.get_ident()


def test_sync_handler_keeps_the_thread_pool(redis_url: str) -> None:
    with inproc_worker(settings(redis_url, "sync"), lambda task: None) as w:
        assert isinstance(w.worker.pool, HandlerPool)


def test_raising_coroutine_is_retried_then_dead_lettered(redis_url: str, bclient: redis.Redis) -> None:
    """A coroutine that always raises runs on deliveries 1, 2, 3 and the 3rd failure dead-letters it."""
    probe = AsyncProbe()
    s = settings(redis_url, "aio-poison", max_deliveries=3, claim_min_idle_ms=300, reclaim_interval_s=0.2)
    with inproc_worker(s, probe) as w:
        mid = enqueue(bclient, body(7, fail=True))
        bad = enqueue(bclient, body(8, bad=True))
        wait_for(lambda: bclient.xlen(f"{QUEUE}:dlq") == 2, 15.0, "both tasks in the DLQ")
        wait_for(lambda: pending_count(bclient) == 0, 5.0, "nothing pending")
        counters = w.worker.counters
    assert sorted((s.n, s.delivery) for s in probe.finished()) == [(7, 1), (7, 2), (7, 3), (8, 1)]
    envelopes = {e["source_id"]: e for e in (json.loads(f[b"payload"]) for _, f in bclient.xrange(f"{QUEUE}:dlq"))}
    assert envelopes[mid]["reason"] == "processing_failed:RuntimeError:boom 7"
    assert envelopes[mid]["delivery_count"] == 3
    assert envelopes[bad]["reason"] == "handler says bad input"
    assert counters.dead_lettered == 2 and counters.failed == 4 and counters.completed == 0


def test_system_exit_in_a_coroutine_fails_the_task_not_the_loop(redis_url: str, bclient: redis.Redis) -> None:
    probe = AsyncProbe()
    with inproc_worker(settings(redis_url, "aio-exit", concurrency=2, max_deliveries=1), probe) as w:
        enqueue(bclient, body(1, exit=True))
        wait_for(lambda: bclient.xlen(f"{QUEUE}:dlq") == 1, 10.0, "the exiting task in the DLQ")
        for n in range(2, 6):
            enqueue(bclient, body(n, sleep_s=0.01))
        wait_for(lambda: w.worker.counters.completed == 4, 10.0, "the later tasks completed")
        assert w.thread.is_alive() and w.worker.pool.busy == 0
    (env,) = (json.loads(f[b"payload"]) for _, f in bclient.xrange(f"{QUEUE}:dlq"))
    assert env["reason"] == "processing_failed:SystemExit:3"


def test_lease_loss_reaches_the_coroutine(redis_url: str, bclient: redis.Redis) -> None:
    """Another holder takes the execution's lease: the running coroutine sees task.cancelled; no ack."""
    probe = AsyncProbe()
    s = settings(redis_url, "aio-lease", lease_ttl_s=1.5, claim_min_idle_ms=5000)
    with inproc_worker(s, probe) as w:
        enqueue(bclient, {**body(1, until_cancelled=True), "execution_id": "aio-e1"})
        wait_for(
            lambda: bclient.get(DEFAULT.lease_key("aio-e1")) is not None and probe.spans, 5.0, "lease taken, running"
        )
        bclient.set(DEFAULT.lease_key("aio-e1"), "someone-else:9")  # a successor owns it now
        wait_for(lambda: bool(probe.finished()), 5.0, "the coroutine ended")
        assert probe.finished()[0].cancelled
        wait_for(lambda: w.worker.counters.leases_lost == 1, 5.0, "the lease counted lost")
        assert pending_count(bclient) == 1 and w.worker.counters.completed == 0


def test_sigterm_drains_running_coroutines_and_hands_back_the_rest(
    redis_url: str, bclient: redis.Redis, tmp_path: Path
) -> None:
    """``--handler module:async_fn``: 2 running finish within the drain, 2 read ahead are handed back."""
    stream = "plaita:test:queue"  # worker_process's queue

    def pending() -> int:
        return int(bclient.xpending(stream, GROUP)["pending"])

    args = ("--handler", "tests.support.async_handlers:record_async", "--concurrency", "2", "--prefetch", "2")
    with worker_process(redis_url, tmp_path, *args, "--drain-timeout-s", "10") as wp:
        wp.wait_state("READING")
        for n in range(4):
            bclient.xadd(stream, {"payload": json.dumps(body(n, sleep_s=1.0)), "schema_version": "1"})
        wait_for(lambda: sum(e[0] == "start" for e in read_log(str(tmp_path / "w.log"))) == 2, 10.0, "2 started")
        wait_for(lambda: pending() == 4, 5.0, "4 read (2 running, 2 read ahead)")
        rc, _elapsed_s = wp.signal_and_time(signal.SIGTERM, 15.0)
        assert rc == 0, wp.stderr()
        assert "Traceback" not in wp.stderr()
    events = read_log(str(tmp_path / "w.log"))
    started = sorted(int(n) for e, _m, n, _d in events if e == "start")
    done = sorted(int(n) for e, _m, n, _d in events if e == "done")
    assert started == done and len(done) == 2
    left = sorted(json.loads(f[b"payload"])["params"]["n"] for _, f in bclient.xrange(stream))
    assert left == sorted(set(range(4)) - set(done))
    group = next(g for g in bclient.xinfo_groups(stream) if g["name"] == GROUP.encode())
    assert group["lag"] == 2 and pending() == 0


class Announced:
    """A bound-method handler whose object has ``tasks_queued``: records the order of what the
    pool tells it and what it runs (``fail`` makes ``tasks_queued`` raise)."""

    def __init__(self, *, fail: bool = False) -> None:
        self.fail = fail
        self.lock = threading.Lock()
        self.events: list[tuple[str, list[str]]] = []

    def tasks_queued(self, tasks: list[Task]) -> None:
        with self.lock:
            self.events.append(("queued", [t.message_id for t in tasks]))
        if self.fail:
            raise RuntimeError("tasks_queued broke")

    async def run(self, task: Task) -> None:
        with self.lock:
            self.events.append(("ran", [task.message_id]))


def _announced_pool(handler: Announced, done: list[str]) -> AsyncHandlerPool:
    pool = AsyncHandlerPool(
        handler.run, concurrency=1, max_deliveries=5, on_done=lambda d: done.extend(t.message_id for t, _, _ in d)
    )
    pool.start()
    return pool


@pytest.mark.parametrize("fail", [False, True])
def test_a_handlers_tasks_queued_hears_of_a_batch_before_any_of_it_starts(fail: bool) -> None:
    """The flow runner sends creates ahead from ``tasks_queued``; it must hear of the whole batch
    before the first task runs. One that raises is logged and changes nothing for the tasks."""
    handler, done = Announced(fail=fail), []
    pool = _announced_pool(handler, done)
    try:
        ids = ["1-0", "2-0", "3-0"]
        pool.submit([Task(i, {}, 1) for i in ids])
        wait_for(lambda: len(done) == 3, 5.0, "the three tasks to finish")
    finally:
        pool.stop()
    assert handler.events[0] == ("queued", ids)
    assert handler.events[1:] == [("ran", [i]) for i in ids]
    assert done == ids
