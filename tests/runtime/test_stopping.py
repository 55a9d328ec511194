"""The STOPPING work on its own: what is handed back when, with a pool and queue that record."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from plaita.config import Settings
from plaita.runtime.counters import Counters
from plaita.runtime.inflight import InFlight, InFlightTable
from plaita.runtime.observer import Observers
from plaita.runtime.stopping import Drainer
from plaita.store.leases import Lease
from plaita.tasks import Task


class Pool:
    """Unstarted tasks to give back; running ones finish when ``finishes`` says so."""

    def __init__(self, unstarted: list[Task], running: int, *, finishes: bool) -> None:
        self.unstarted, self.running, self.finishes = unstarted, running, finishes
        self.waited: list[float] = []
        #: Hand-back calls made before the drain began to wait (set by ``Setup``).
        self.queue: Queue | None = None
        self.handed_back_before_wait: list[int] = []

    def take_unstarted(self) -> list[Task]:
        taken, self.unstarted = self.unstarted, []
        return taken

    @property
    def busy(self) -> int:
        return self.running + len(self.unstarted)

    def wait_idle(self, deadline_s: float, abort: threading.Event) -> bool:
        self.waited.append(deadline_s)
        self.handed_back_before_wait.append(len(self.queue.calls) if self.queue else -1)
        return self.finishes


class Queue:
    def __init__(self, *, failing: bool = False) -> None:
        self.failing = failing
        self.calls: list[tuple[list[str], list[tuple[str, str]]]] = []

    def hand_back(self, entries: list[tuple[str, Any]], releases: list[tuple[str, str]]) -> None:
        if self.failing:
            raise ConnectionError("redis down")
        self.calls.append(([mid for mid, _ in entries], list(releases)))


class Settler:
    def __init__(self) -> None:
        self.closed = False
        self.flushed = False
        self.backlog = 0

    def close(self) -> None:
        self.closed = True

    def flush(self, timeout_s: float) -> bool:
        assert self.closed, "flushed before closing: a late outcome could still be added"
        self.flushed = True
        return True


class Setup:
    def __init__(self, *, running: list[str], unstarted: list[str], finishes: bool, failing: bool = False) -> None:
        self.table = InFlightTable()
        tasks = {mid: Task(mid, {}, 1) for mid in running + unstarted}
        for mid, task in tasks.items():
            self.table.add(InFlight(task, {"body": b"{}"}, Lease(mid, f"lease:{mid}", "me", 1)))
        self.pool = Pool([tasks[m] for m in unstarted], len(running), finishes=finishes)
        self.queue, self.settler = Queue(failing=failing), Settler()
        self.pool.queue = self.queue
        self.stop_now = threading.Event()
        self.counters = Counters(Observers())
        self.drainer = Drainer(
            Settings(redis_url="redis://127.0.0.1:1", drain_timeout_s=5.0),
            queue=self.queue,  # type: ignore[arg-type]
            pool=self.pool,  # type: ignore[arg-type]
            inflight=self.table,
            settler=self.settler,  # type: ignore[arg-type]
            counters=self.counters,
            stop_now=self.stop_now,
        )
        self.tasks = tasks


def test_graceful_hands_back_the_unstarted_before_waiting_and_nothing_else_when_drained() -> None:
    s = Setup(running=["1-0"], unstarted=["1-1", "1-2"], finishes=True)
    s.drainer.drain()
    assert s.queue.calls == [(["1-1", "1-2"], [("lease:1-1", "me"), ("lease:1-2", "me")])]
    assert s.pool.handed_back_before_wait == [1], "the unstarted went back before the wait, not after"
    assert not s.tasks["1-0"].cancelled.is_set()
    assert s.counters.handed_back == 2
    assert s.settler.closed and s.settler.flushed


def test_graceful_past_the_deadline_abandons_and_hands_back_the_running() -> None:
    s = Setup(running=["1-0"], unstarted=[], finishes=False)
    s.drainer.drain()
    assert s.queue.calls == [(["1-0"], [("lease:1-0", "me")])]
    assert s.tasks["1-0"].cancelled.is_set()
    assert s.table.live() == []  # a late finish is not acked
    assert s.counters.handed_back == 1


def test_stop_now_hands_everything_back_in_one_call_without_waiting() -> None:
    s = Setup(running=["1-0"], unstarted=["1-1"], finishes=True)
    s.stop_now.set()
    s.drainer.drain()
    assert s.pool.waited == []
    assert [sorted(ids) for ids, _ in s.queue.calls] == [["1-0", "1-1"]]
    assert s.tasks["1-0"].cancelled.is_set()
    assert s.counters.handed_back == 2 and s.settler.flushed


def test_a_failed_hand_back_is_logged_and_not_counted(caplog: pytest.LogCaptureFixture) -> None:
    s = Setup(running=[], unstarted=["1-0"], finishes=True, failing=True)
    s.drainer.drain()
    assert s.counters.handed_back == 0
    assert "could not hand back 1 task(s)" in caplog.text
    assert s.settler.flushed  # the stop goes on
