"""The ack window: at most ``window`` tasks running or finished with their ack unconfirmed.

That is what bounds the tasks a worker killed with kill -9 runs again (``--concurrency`` +
``ACK_WINDOW``). The queue is the settler tests' recorder, failing while Redis is "down", so
acks stay unconfirmed for as long as a test wants.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest

from plaita.runtime.aio_pool import AsyncHandlerPool
from plaita.runtime.outcomes import Done, Outcome
from plaita.runtime.pool import HandlerPool, grant_size
from plaita.runtime.settler import Phase, Settler
from plaita.tasks import Task
from tests.runtime.test_settler import RecordingQueue
from tests.support.ops import holds_for, wait_until

WINDOW = 8


@pytest.fixture
def queue() -> RecordingQueue:
    return RecordingQueue()


@pytest.fixture
def settler(queue: RecordingQueue) -> Iterator[Settler]:
    s = Settler(queue, on_failure=lambda _exc: None, window=WINDOW)  # type: ignore[arg-type]
    s.start()
    yield s
    s.close()


def test_slots_come_back_when_given_back_or_when_their_acks_are_confirmed(
    settler: Settler, queue: RecordingQueue
) -> None:
    assert settler.take(5) == 5
    assert settler.take(5) == 3  # only what is left
    assert settler.take(1, block=False) == 0
    settler.give_back(2)
    assert settler.take(4, block=False) == 2
    # Outcomes hold a slot each until Redis confirms them; the handlers' slots are given back.
    queue.failing = True
    settler.put_many([Outcome(f"1-{i}") for i in range(WINDOW)])
    settler.give_back(WINDOW)
    wait_until(lambda: settler.phase is Phase.HELD, 5.0, "the batch to fail")
    assert settler.take(1, block=False) == 0  # unconfirmed acks keep the window full
    queue.failing = False
    settler.redis_ok()
    assert settler.flush(5.0)
    assert settler.take(WINDOW, block=False) == WINDOW


def test_a_blocked_take_returns_once_the_acks_are_confirmed_and_never_after_close(
    settler: Settler, queue: RecordingQueue
) -> None:
    queue.failing = True
    assert settler.take(WINDOW) == WINDOW
    settler.put_many([Outcome(f"1-{i}") for i in range(WINDOW)])
    settler.give_back(WINDOW)
    got: list[int] = []
    taker = threading.Thread(target=lambda: got.append(settler.take(3)), daemon=True)
    taker.start()
    holds_for(lambda: not got, 0.3, "take waits while the window is full")
    queue.failing = False
    settler.redis_ok()
    wait_until(lambda: got == [3], 5.0, "take to return once the acks were confirmed")
    taker.join(5.0)
    settler.close()
    assert settler.take(100) == 100  # closed: nothing is acked any more, nothing to wait for


def _task(i: int) -> Task:
    return Task(f"1-{i}", {"type": "start"}, 1)


def _router(settler: Settler, finished: list[str]) -> Callable[[list[Done]], None]:
    lock = threading.Lock()

    def on_done(done: list[Done]) -> None:
        with lock:
            finished.extend(task.message_id for task, _, _ in done)
        settler.put_many([Outcome(task.message_id) if outcome is None else outcome for task, outcome, _ in done])

    return on_done


@pytest.mark.parametrize("pool_class", [HandlerPool, AsyncHandlerPool])
def test_with_acks_unconfirmed_a_pool_finishes_at_most_the_window_then_the_rest_after_redis_returns(
    pool_class: type[HandlerPool], settler: Settler, queue: RecordingQueue
) -> None:
    queue.failing = True  # Redis down: no ack is confirmed
    finished: list[str] = []

    def handler(_task: Task) -> None:
        return None

    pool = pool_class(
        handler, concurrency=2, max_deliveries=5, on_done=_router(settler, finished), slots=settler, window=WINDOW
    )
    pool.start()
    try:
        pool.submit([_task(i) for i in range(40)])
        wait_until(lambda: len(finished) >= WINDOW, 10.0, "the window's worth of tasks to finish")
        holds_for(lambda: len(finished) <= WINDOW, 0.5, "no task beyond the window finishes")
        queue.failing = False
        settler.redis_ok()
        wait_until(lambda: len(finished) == 40, 10.0, "every task to finish once acks are confirmed")
        assert settler.flush(5.0)
        assert sorted(queue.acked()) == sorted(f"1-{i}" for i in range(40))
    finally:
        pool.stop()


def test_threads_each_holding_a_grant_leave_most_of_the_window_free() -> None:
    for concurrency in (1, 2, 4, 16, 64, 256, 1024):
        window = concurrency + 256
        grant = grant_size(window, concurrency)
        assert grant >= 1
        assert concurrency * grant <= max(concurrency, window // 4)
