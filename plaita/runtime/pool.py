"""Handler threads: run tasks on ``concurrency`` daemon threads and report finished chunks."""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Protocol

from plaita.errors import BadTaskError, LeaseLostError, NotForThisWorker
from plaita.runtime.handover import not_for_this_worker
from plaita.runtime.outcomes import RETRY, Done, Outcome
from plaita.store.errors import is_redis_failure
from plaita.tasks import Task

logger = logging.getLogger(__name__)

Handler = Callable[[Task], object]

#: A task slower than this reports its outcome at once instead of with its chunk.
_REPORT_EVERY_S = 0.05
#: Finished tasks a handler thread reports at once at most (one router call: counts, metrics,
#: in-flight table, settler); fewer at the end of a chunk or when the ack window is full.
_REPORT_EVERY_TASKS = 32
#: Exponential moving average weight for handler duration.
_EWMA_ALPHA = 0.2
#: A handler with ``run_batch`` (``--pool process``) gets up to this many tasks at once, while its
#: tasks take less than ``_BATCH_BELOW_S`` on average: one round trip to a child for all of them.
#: Each round trip waits for the child to be scheduled and back; on a busy machine that wait is
#: most of a 0 ms task's cost, so a batch takes what its chunk holds (ack-window slots permitting).
_BATCH_MAX = 64
_BATCH_BELOW_S = 0.001


class Pool(Protocol):
    """What the worker needs from a handler pool (threads or one event loop)."""

    mean_duration_s: float | None

    def start(self) -> None: ...
    def submit(self, tasks: list[Task]) -> None: ...
    @property
    def busy(self) -> int: ...
    def take_unstarted(self) -> list[Task]: ...
    def wait_idle(self, deadline_s: float, abort: threading.Event) -> bool: ...
    def stop(self) -> None: ...


class AckSlots(Protocol):
    """The ack window a pool takes a slot of before each task (the settler; see its module)."""

    def take(self, n: int, *, block: bool = True) -> int: ...
    def give_back(self, n: int) -> None: ...
    def on_room(self, listener: Callable[[], None]) -> None: ...


class _Unbounded:
    """No window (a pool built without a settler, as in tests): every slot is free."""

    def take(self, n: int, *, block: bool = True) -> int:
        return n

    def give_back(self, n: int) -> None:
        pass

    def on_room(self, listener: Callable[[], None]) -> None:
        pass


UNBOUNDED: AckSlots = _Unbounded()


def grant_size(window: int, concurrency: int) -> int:
    """Slots a handler thread takes at once: a few, so the window's lock is not taken per task,
    and few enough that threads each holding a grant leave most of the window free."""
    return max(1, min(32, window // (4 * concurrency)))


class PoolBase:
    """What both pools share: the drain's wait and the handlers' mean duration."""

    #: Exponential moving average of handler durations (the intake's prefetch reads it).
    mean_duration_s: float | None = None

    @property
    def busy(self) -> int:
        raise NotImplementedError

    def wait_idle(self, deadline_s: float, abort: threading.Event) -> bool:
        """Wait until nothing is queued or running, the monotonic deadline, or ``abort``."""
        while True:
            if self.busy <= 0:
                return True
            if deadline_s - time.monotonic() <= 0 or abort.is_set():
                return False
            abort.wait(0.02)

    def _note_duration(self, duration_s: float) -> None:
        """Fold one handler's duration into the mean (call it under the pool's lock)."""
        m = self.mean_duration_s
        self.mean_duration_s = duration_s if m is None else m + _EWMA_ALPHA * (duration_s - m)


def stream_order(message_id: str) -> tuple[int, int]:
    ms, _, seq = message_id.rpartition("/")[2].partition("-")  # a partitioned id is <p>/<ms>-<seq>
    return (int(ms), int(seq or 0)) if ms.isdigit() and (seq or "0").isdigit() else (0, 0)


class HandlerPool(PoolBase):
    """Runs tasks on daemon threads; reports finished tasks through ``on_done`` in chunks.

    A read batch is handed over in chunks (one per thread at most), not task by task: with
    fast handlers the per-task queue, lock and wake-up costs would dominate. A chunk stays
    shared while a thread works through it, so ``take_unstarted`` can take back every task
    no thread has started yet, wherever it is, and hand them back in stream order.
    """

    def __init__(
        self,
        handler: Handler,
        *,
        concurrency: int,
        max_deliveries: int,
        on_done: Callable[[list[Done]], None],
        slots: AckSlots = UNBOUNDED,
        window: int = 0,
    ) -> None:
        self._handler = handler
        #: ``handler.run_batch`` when it has one and may use it now (``ProcessHandler``), else None.
        self._batch: Callable[[list[Task]], list[BaseException | None]] | None = (
            getattr(handler, "run_batch", None) if getattr(handler, "batchable", False) else None
        )
        self._max_deliveries = max_deliveries
        self._on_done = on_done
        self._concurrency = concurrency
        self._slots = slots
        self._grant = grant_size(window, concurrency) if window else 32
        self._work: queue.SimpleQueue[collections.deque[Task] | None] = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._run, name=f"plaita-handler-{i}", daemon=True) for i in range(concurrency)
        ]
        self._lock = threading.Lock()
        #: Tasks submitted and not yet reported (queued, running or finished on their way to the router).
        self._queued = 0
        self._chunks: list[collections.deque[Task]] = []  # every chunk not yet worked through

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def submit(self, tasks: list[Task]) -> None:
        """Queue tasks, split into at most ``concurrency`` chunks."""
        if not tasks:
            return
        size = -(-len(tasks) // self._concurrency)  # ceil
        chunks = [collections.deque(tasks[start : start + size]) for start in range(0, len(tasks), size)]
        with self._lock:
            self._queued += len(tasks)
            self._chunks.extend(chunks)
        for chunk in chunks:
            self._work.put(chunk)

    @property
    def busy(self) -> int:
        """Tasks queued or running."""
        with self._lock:
            return self._queued

    def take_unstarted(self) -> list[Task]:
        """Remove and return every task no handler has started, in stream order."""
        taken: list[Task] = []
        with self._lock:
            for chunk in self._chunks:
                # Popped one by one, as the handlers pop theirs (``popleft`` is atomic): each task
                # goes either here or to a handler, never to both. A thread working on a chunk
                # finds it empty and moves on.
                while chunk:
                    try:
                        taken.append(chunk.popleft())
                    except IndexError:
                        break
            self._chunks.clear()
            self._queued -= len(taken)
        return sorted(taken, key=lambda t: stream_order(t.message_id))

    def stop(self) -> None:
        """Ask idle threads to exit; running handlers are not interrupted (threads are daemons)."""
        for _ in self._threads:
            self._work.put(None)

    def _run(self) -> None:
        while True:
            chunk = self._work.get()
            if chunk is None:
                return
            self._work_through(chunk)

    def _work_through(self, chunk: collections.deque[Task]) -> None:
        """Run a chunk's tasks in order, with no lock round per task: a task is taken with an
        atomic ``popleft`` (``take_unstarted`` pops the same way, so each goes to one side only)
        and counts as queued until it is reported, so ``busy`` never misses a task, and the drain
        never sees an idle pool with an outcome still on its way to the settler. One clock
        reading per task: each one ends a task's run and starts the next one's."""
        done: list[Done] = []
        slots = 0  # ack-window slots this thread holds, one per task it may still start
        handler, clock = self._handler, time.monotonic
        started = clock()
        while True:
            if not slots:
                if len(done) >= _REPORT_EVERY_TASKS:
                    self._report(done)
                    done = []
                # More slots without a report while the window has room: a report per grant
                # would route a chunk in halves or quarters (a grant shrinks with concurrency).
                slots = self._slots.take(self._grant, block=False)
                if not slots:
                    if done:  # routed first: their acks are what frees the window
                        self._report(done)
                        done = []
                    slots = self._slots.take(self._grant)
                started = clock()
            try:
                task = chunk.popleft()
            except IndexError:
                break
            slots -= 1
            if self._batch is not None and slots and self._fast():
                slots = self._work_batch(chunk, task, slots, done, started)
                now = clock()
            else:
                outcome: Outcome | None
                try:
                    handler(task)
                except BaseException as exc:  # noqa: B036 - see judge()
                    outcome = judge(task, exc, self._max_deliveries)
                else:
                    outcome = None  # a bare success: the router builds its Outcome
                now = clock()
                done.append((task, outcome, now - started))
            if now - started > _REPORT_EVERY_S:
                # A slow task reports at once: its ack must not wait for the rest of the chunk.
                self._report(done)
                done = []
                now = clock()
            started = now
        with self._lock:
            # By identity: deques compare equal by content, and empty ones are all equal.
            self._chunks = [c for c in self._chunks if c is not chunk]
        if done:
            self._report(done)
        self._slots.give_back(slots)

    def _fast(self) -> bool:
        mean_s = self.mean_duration_s
        return mean_s is not None and mean_s < _BATCH_BELOW_S

    def _work_batch(
        self, chunk: collections.deque[Task], first: Task, slots: int, done: list[Done], started_s: float
    ) -> int:
        """Run ``first`` and up to ``slots`` more of ``chunk`` in one ``run_batch``; append what ran to
        ``done`` (each with its share of the time); tasks that did not start go back to the front
        of ``chunk``. More window slots are taken for the batch while the window has room (never
        waiting for them). Returns the slots this thread holds after it."""
        want = min(len(chunk), _BATCH_MAX - 1) - slots
        if want > 0:
            slots += self._slots.take(want, block=False)
        tasks = [first]
        while len(tasks) <= min(slots, _BATCH_MAX - 1):
            try:
                tasks.append(chunk.popleft())
            except IndexError:
                break
        assert self._batch is not None
        try:
            raised = self._batch(tasks)
        except BaseException as exc:  # noqa: B036 - a plaita bug: each task a failed delivery, as one alone
            raised = [exc] * len(tasks)
        for task in reversed(tasks[len(raised) :]):  # never started: the next round runs them
            chunk.appendleft(task)
        each_s = (time.monotonic() - started_s) / max(1, len(raised))
        for task, error in zip(tasks, raised, strict=False):
            outcome = None if error is None else judge(task, error, self._max_deliveries)
            done.append((task, outcome, each_s))
        return slots - max(0, len(raised) - 1)

    def _report(self, done: list[Done]) -> None:
        """Route finished tasks; their window slots come back (the settler holds one for each
        outcome it queued)."""
        try:
            self._on_done(done)
        finally:
            with self._lock:
                self._queued -= len(done)
                m = self.mean_duration_s
                for _, _, duration_s in done:  # the moving average, folded in task by task
                    m = duration_s if m is None else m + _EWMA_ALPHA * (duration_s - m)
                self.mean_duration_s = m
            self._slots.give_back(len(done))


def exception_text(exc: BaseException) -> str:
    """``str(exc)``, or a placeholder when the exception's own ``__str__`` raises (it is user code)."""
    try:
        return str(exc)
    except BaseException:  # noqa: B036 - judging a failure must not fail
        return f"<{type(exc).__name__} whose str() raised>"


def _is_redis_failure(exc: BaseException) -> bool:
    try:
        return is_redis_failure(exc)  # reads str(exc): see exception_text
    except BaseException:  # noqa: B036 - an exception that cannot be read is the handler's, not Redis's
        return False


def judge(task: Task, exc: BaseException, max_deliveries: int) -> Outcome:
    """What to do with the message of a task whose handler raised ``exc``.

    Every ``BaseException`` counts: a handler raising SystemExit or KeyboardInterrupt must not
    kill its thread or event loop (the task would look running forever and the pool would
    shrink). It is a failed delivery like any other, so a task that does it every time reaches
    the DLQ; ``BadTaskError`` goes there at once.
    """
    if isinstance(exc, NotForThisWorker):
        return not_for_this_worker(task, exc, max_deliveries)
    if isinstance(exc, BadTaskError):
        logger.warning("task %s rejected by its handler (%s): moved to the DLQ", task.message_id, exc)
        return Outcome.to_dlq(task.message_id, exc.reason, task.delivery_count, task.body)
    reason = f"processing_failed:{type(exc).__name__}:{exception_text(exc)}"[:500]
    if task.delivery_count >= max_deliveries:
        logger.error(
            "task %s failed on delivery %d of %d (%s): moved to the DLQ",
            task.message_id,
            task.delivery_count,
            max_deliveries,
            reason,
        )
        return Outcome.to_dlq(task.message_id, reason, task.delivery_count, task.body)
    _log_failed_delivery(task, exc, max_deliveries)
    return Outcome(task.message_id, RETRY)


def _log_failed_delivery(task: Task, exc: BaseException, max_deliveries: int) -> None:
    if isinstance(exc, LeaseLostError):  # expected after an outage longer than the lease: no traceback
        logger.warning("task %s stopped: %s; left pending for the lease's next holder", task.message_id, exc)
        return
    """A delivery failed and the task stays pending: one line for an outage, a traceback for a bug."""
    if _is_redis_failure(exc):  # an outage, not a bug in the handler: one line, no traceback
        logger.warning(
            "task %s failed on delivery %d of %d: Redis failed (%s: %s); left pending for redelivery",
            task.message_id,
            task.delivery_count,
            max_deliveries,
            type(exc).__name__,
            exception_text(exc),
        )
        return
    logger.error(
        "task %s failed on delivery %d of %d (%s); left pending for redelivery",
        task.message_id,
        task.delivery_count,
        max_deliveries,
        type(exc).__name__,
        exc_info=exc,
    )
