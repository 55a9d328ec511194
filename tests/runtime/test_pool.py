"""What both handler pools share (``PoolBase``), and the thread pool driven without Redis."""

from __future__ import annotations

import threading
import time

import pytest

from plaita.runtime.aio_pool import AsyncHandlerPool
from plaita.runtime.outcomes import Done
from plaita.runtime.pool import HandlerPool, PoolBase
from plaita.tasks import Task


class Counted(PoolBase):
    def __init__(self, busy: int) -> None:
        self.n = busy

    @property
    def busy(self) -> int:
        return self.n


def test_wait_idle_true_once_idle_false_at_the_deadline_or_abort() -> None:
    never = threading.Event()
    assert Counted(0).wait_idle(time.monotonic() + 5, never)
    started = time.monotonic()
    assert not Counted(1).wait_idle(started + 0.1, never)
    assert 0.1 <= time.monotonic() - started < 2.0
    abort = threading.Event()
    threading.Timer(0.05, abort.set).start()
    started = time.monotonic()
    assert not Counted(1).wait_idle(started + 30, abort)
    assert time.monotonic() - started < 5.0  # the abort, not the 30 s deadline


def test_wait_idle_sees_the_pool_go_idle() -> None:
    pool = Counted(1)
    threading.Timer(0.05, lambda: setattr(pool, "n", 0)).start()
    assert pool.wait_idle(time.monotonic() + 10, threading.Event())


def test_the_mean_duration_starts_at_the_first_and_moves_a_fifth_of_the_way() -> None:
    pool = Counted(0)
    assert pool.mean_duration_s is None
    pool._note_duration(1.0)
    assert pool.mean_duration_s == 1.0
    pool._note_duration(2.0)
    assert pool.mean_duration_s == pytest.approx(1.2)


@pytest.mark.parametrize("pool_class", [HandlerPool, AsyncHandlerPool])
def test_both_pools_report_every_task_and_learn_its_duration(pool_class: type[HandlerPool]) -> None:
    reported: list[Done] = []
    lock = threading.Lock()

    def on_done(done: list[Done]) -> None:
        with lock:
            reported.extend(done)

    pool = pool_class(lambda task: time.sleep(0.01), concurrency=2, max_deliveries=3, on_done=on_done)
    pool.start()
    try:
        pool.submit([Task(f"1-{i}", {}, 1) for i in range(6)])
        assert pool.wait_idle(time.monotonic() + 10, threading.Event())
        deadline = time.monotonic() + 10
        while len(reported) < 6 and time.monotonic() < deadline:  # the last chunk's report follows
            time.sleep(0.01)
        assert sorted(t.message_id for t, _, _ in reported) == [f"1-{i}" for i in range(6)]
        assert pool.mean_duration_s is not None and pool.mean_duration_s >= 0.005
    finally:
        pool.stop()


def test_tasks_taken_back_while_handlers_pop_are_either_run_or_taken_never_both() -> None:
    """``take_unstarted`` and the handler threads pop the same chunks without a lock round per
    task: every task goes to exactly one side, and ``busy`` ends at 0."""
    ran: list[str] = []
    lock = threading.Lock()

    def handler(task: Task) -> None:
        with lock:
            ran.append(task.message_id)

    reported: list[Done] = []

    def on_done(done: list[Done]) -> None:
        with lock:
            reported.extend(done)

    pool = HandlerPool(handler, concurrency=2, max_deliveries=3, on_done=on_done)
    pool.start()
    try:
        for round_ in range(20):
            ran.clear()
            reported.clear()
            ids = [f"{round_}-{i}" for i in range(2000)]
            pool.submit([Task(mid, {}, 1) for mid in ids])
            taken = [t.message_id for t in pool.take_unstarted()]
            assert pool.wait_idle(time.monotonic() + 10, threading.Event())
            with lock:
                assert len(ran) == len(set(ran)) and not set(ran) & set(taken)
                assert sorted(ran + taken) == sorted(ids)
                assert sorted(t.message_id for t, _, _ in reported) == sorted(ran)
            assert taken == sorted(taken, key=lambda mid: int(mid.split("-")[1]))  # stream order
            assert pool.busy == 0
    finally:
        pool.stop()
