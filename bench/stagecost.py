"""``python -m bench.stagecost``: what each stage of a plain task costs the worker, without Redis.

Runs the worker's own objects in one thread on a made-up read reply (batches of ``--batch`` plain
no-op task entries, as ``XREADGROUP`` returns them): the reply's parse, the intake, the handler
pool's loop with the outcome router, and the settler's queueing (not its round trip). Each stage
is timed by the thread's CPU time over ``--tasks`` tasks, best of ``--repeats``: single-threaded,
so the numbers repeat within ~15 % on a loaded machine, far better than any whole-worker rate.
What it leaves out is the Redis calls themselves and the threads' hand-offs (wake-ups, GIL).
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from typing import Any

from plaita.config import Settings
from plaita.ops.histogram import observe_many
from plaita.ops.metrics import Metrics
from plaita.runtime.counters import Counters
from plaita.runtime.inflight import InFlightTable
from plaita.runtime.intake import Intake
from plaita.runtime.observer import Observers
from plaita.runtime.outcomes import OutcomeRouter
from plaita.runtime.pool import HandlerPool
from plaita.runtime.settler import Settler
from plaita.store.keyspace import DEFAULT
from plaita.store.streams.entries import parse_read
from plaita.tasks import Task


class _Metrics:
    """What ``plaita.ops.Operations`` does with the task notifications."""

    def __init__(self) -> None:
        self.metrics = Metrics()
        self._children: dict[str, Any] = {}

    def tasks_counted(self, outcome: str, n: int) -> None:
        child = self._children.get(outcome)
        if child is None:
            child = self._children[outcome] = self.metrics.tasks.labels(outcome=outcome)
        child.inc(n)

    def tasks_finished(self, durations_s: list[float]) -> None:
        observe_many(self.metrics.handler_seconds, durations_s)


class _Leases:
    keyspace = DEFAULT

    def acquire_many(self, execution_ids: list[str], keyspaces: object = None) -> list[Any]:
        assert not execution_ids
        return []


class _Pool:
    mean_duration_s: float | None = 0.0

    def __init__(self) -> None:
        self.submitted: list[Task] = []

    def submit(self, tasks: list[Task]) -> None:
        self.submitted += tasks


def reply(first: int, n: int) -> list[Any]:
    """A raw RESP2 ``XREADGROUP`` reply of ``n`` plain tasks (as ``bench.common.fields`` writes them)."""
    items = []
    for i in range(first, first + n):
        payload = json.dumps({"type": "start", "flow_id": "bench", "params": {"n": i}}, separators=(",", ":"))
        items.append([f"{1000 + i}-0".encode(), [b"payload", payload.encode(), b"schema_version", b"1"]])
    return [[b"stream", items]]


def _noop(task: Task) -> None:
    pass


class Stages:
    """One worker's objects wired as ``plaita.runtime.worker`` wires them (no threads started)."""

    def __init__(self, concurrency: int) -> None:
        self.settings = Settings(redis_url="redis://127.0.0.1:1", concurrency=concurrency)
        observers = Observers()
        observers.attach(_Metrics())  # type: ignore[arg-type]
        self.counters = Counters(observers)
        self.inflight = InFlightTable()
        self.settler = Settler(None, on_failure=lambda exc: None, window=1 << 30)  # type: ignore[arg-type]
        self.pool = _Pool()
        self.intake = Intake(
            self.settings,
            inflight=self.inflight,
            pool=self.pool,  # type: ignore[arg-type]
            settler=self.settler,
            leases=_Leases(),  # type: ignore[arg-type]
            counters=self.counters,
        )
        self.router = OutcomeRouter(
            inflight=self.inflight,
            settler=self.settler,
            counters=self.counters,
            observers=observers,
            slot_freed=__import__("threading").Event(),
        )
        self.handlers = HandlerPool(
            _noop, concurrency=concurrency, max_deliveries=3, on_done=self.router, slots=self.settler, window=1 << 20
        )


def run_once(tasks: int, batch: int, concurrency: int) -> dict[str, float]:
    """One pass, batch by batch through every stage (so nothing piles up for the collector)."""
    s = Stages(concurrency)
    replies = [reply(i, batch) for i in range(0, tasks, batch)]
    chunk = -(-batch // concurrency)
    spent = collections.Counter[str]()
    clock = time.thread_time  # CPU time of this thread: a preemption by another process does not count
    for r in replies:
        t0 = clock()
        entries = parse_read(r)
        t1 = clock()
        s.intake.accept(entries)
        t2 = clock()
        started, s.pool.submitted = s.pool.submitted, []
        s.handlers.submit(started)
        for _ in range(-(-len(started) // chunk)):
            work = s.handlers._work.get()
            assert work is not None
            s.handlers._work_through(work)
        t3 = clock()
        pending = s.settler._pending
        while pending:
            b = [pending.popleft() for _ in range(min(500, len(pending)))]
            [o.message_id for o in b if o.kind == "ack"]
            [o.dead for o in b if o.kind == "dead" and o.dead is not None]
            [o.release for o in b if o.release is not None]
            s.settler._confirmed(len(b))
        t4 = clock()
        spent["parse the reply (Entry per entry)"] += t1 - t0
        spent["intake (checks, JSON, Task, in-flight)"] += t2 - t1
        spent["hand-off, handler loop, router"] += t3 - t2
        spent["settler batch (no I/O)"] += t4 - t3
    assert s.counters.completed == tasks and len(s.inflight) == 0, (s.counters.completed, len(s.inflight))
    return {k: v / tasks * 1e6 for k, v in spent.items()}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.stagecost", description=__doc__)
    parser.add_argument("--tasks", type=int, default=50_000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    best: dict[str, float] = {}
    for _ in range(args.repeats):
        for k, v in run_once(args.tasks, args.batch, args.concurrency).items():
            best[k] = min(best.get(k, v), v)
    for k, v in best.items():
        print(f"{v:6.2f} µs/task  {k}")
    print(f"{sum(best.values()):6.2f} µs/task  all")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
