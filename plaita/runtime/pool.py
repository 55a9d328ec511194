"""Handler threads and the settler thread.

Handlers run on ``concurrency`` daemon threads. Outcomes go to one settler thread that acks
and dead-letters in batches (one MULTI/EXEC round trip per batch), so a fast handler is not
held back by a round trip per task and a slow Redis never blocks a handler. A failed batch
is kept (bounded) and retried after the owner has seen Redis come back.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from plaita.errors import BadTaskError
from plaita.store.streams import DeadLetter, StreamQueue
from plaita.tasks import Task

logger = logging.getLogger(__name__)

Handler = Callable[[Task], object]

#: Settled-but-not-yet-acked outcomes kept across an outage; past this the oldest are
#: dropped (they stay pending in Redis and are redelivered: at-least-once holds).
MAX_UNSETTLED = 50_000
#: Most outcomes settled in one MULTI/EXEC.
SETTLE_BATCH = 500
#: A task slower than this reports its outcome at once instead of with its chunk.
_REPORT_EVERY_S = 0.05
#: Exponential moving average weight for handler duration.
_EWMA_ALPHA = 0.2


#: Outcome kinds.
ACK, DEAD, RETRY = "ack", "dead", "retry"


@dataclass(frozen=True)
class Outcome:
    """What to do with a message once its handler returned.

    ``ack``: done, XACK + XDEL. ``dead``: move to the DLQ. ``retry``: the handler failed; leave
    it pending for redelivery. ``release``
    is a lease (key, value) to release in the same transaction as the ack.
    """

    message_id: str
    kind: str = ACK
    dead: DeadLetter | None = None
    release: tuple[str, str] | None = None

    @classmethod
    def to_dlq(cls, message_id: str, reason: str, delivery_count: int, payload: object) -> Outcome:
        """Move ``message_id`` to the DLQ with ``reason``, keeping ``payload``."""
        return cls(message_id, DEAD, DeadLetter(message_id, reason, delivery_count, payload))


Done = tuple[Task, Outcome, float]


def _stream_order(message_id: str) -> tuple[int, int]:
    ms, _, seq = message_id.partition("-")
    return (int(ms), int(seq or 0)) if ms.isdigit() and (seq or "0").isdigit() else (0, 0)


class HandlerPool:
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
    ) -> None:
        self._handler = handler
        self._max_deliveries = max_deliveries
        self._on_done = on_done
        self._concurrency = concurrency
        self._work: queue.SimpleQueue[collections.deque[Task] | None] = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._run, name=f"plaita-handler-{i}", daemon=True) for i in range(concurrency)
        ]
        self._lock = threading.Lock()
        self._queued = 0
        self._running: set[str] = set()
        self._chunks: list[collections.deque[Task]] = []  # every chunk not yet worked through
        self.mean_duration_s: float | None = None

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
            return self._queued + len(self._running)

    def running_ids(self) -> list[str]:
        with self._lock:
            return sorted(self._running)

    def take_unstarted(self) -> list[Task]:
        """Remove and return every task no handler has started, in stream order."""
        with self._lock:
            taken = [task for chunk in self._chunks for task in chunk]
            for chunk in self._chunks:
                chunk.clear()  # a thread working on it finds it empty and moves on
            self._chunks.clear()
            self._queued -= len(taken)
        return sorted(taken, key=lambda t: _stream_order(t.message_id))

    def wait_idle(self, deadline_s: float, abort: threading.Event) -> bool:
        """Wait until nothing is queued or running, the monotonic deadline, or ``abort``."""
        while True:
            if self.busy <= 0:
                return True
            if deadline_s - time.monotonic() <= 0 or abort.is_set():
                return False
            abort.wait(0.02)

    def stop(self) -> None:
        """Ask idle threads to exit; running handlers are not interrupted (threads are daemons)."""
        for _ in self._threads:
            self._work.put(None)

    def _run(self) -> None:
        while True:
            chunk = self._work.get()
            if chunk is None:
                return
            done: list[Done] = []
            while True:
                with self._lock:
                    if not chunk:
                        # By identity: deques compare equal by content, and empty ones are all equal.
                        self._chunks = [c for c in self._chunks if c is not chunk]
                        break
                    task = chunk.popleft()
                    self._queued -= 1
                    self._running.add(task.message_id)
                started = time.monotonic()
                outcome = self._call(task)
                duration = time.monotonic() - started
                with self._lock:
                    self._running.discard(task.message_id)
                    m = self.mean_duration_s
                    self.mean_duration_s = duration if m is None else m + _EWMA_ALPHA * (duration - m)
                done.append((task, outcome, duration))
                if duration > _REPORT_EVERY_S:
                    # A slow task reports at once: its ack must not wait for the rest of the chunk.
                    self._on_done(done)
                    done = []
            if done:
                self._on_done(done)

    def _call(self, task: Task) -> Outcome:
        """Run the handler and say what to do with its message."""
        try:
            self._handler(task)
        except BadTaskError as exc:
            logger.warning("task %s rejected by its handler (%s): moved to the DLQ", task.message_id, exc)
            return Outcome.to_dlq(task.message_id, exc.reason, task.delivery_count, task.body)
        except Exception as exc:
            reason = f"processing_failed:{type(exc).__name__}:{exc}"[:500]
            if task.delivery_count >= self._max_deliveries:
                logger.error(
                    "task %s failed on delivery %d of %d (%s): moved to the DLQ",
                    task.message_id,
                    task.delivery_count,
                    self._max_deliveries,
                    reason,
                )
                return Outcome.to_dlq(task.message_id, reason, task.delivery_count, task.body)
            logger.error(
                "task %s failed on delivery %d of %d; left pending for redelivery",
                task.message_id,
                task.delivery_count,
                self._max_deliveries,
                exc_info=True,
            )
            return Outcome(task.message_id, RETRY)
        return Outcome(task.message_id)


class Settler:
    """The thread that acks and dead-letters finished tasks in batches."""

    def __init__(self, stream_queue: StreamQueue, *, on_failure: Callable[[BaseException], None]) -> None:
        self._queue = stream_queue
        self._on_failure = on_failure
        self._cond = threading.Condition()
        self._pending: collections.deque[Outcome] = collections.deque()
        self._healthy = True
        self._closed = False
        self._dropped = 0
        self._batch: list[Outcome] = []
        self._idle_waiting = False
        self._thread = threading.Thread(target=self._run, name="plaita-settler", daemon=True)
        self.settled = 0
        self.dead_lettered = 0

    def start(self) -> None:
        self._thread.start()

    def put(self, outcome: Outcome) -> None:
        self.put_many([outcome])

    def put_many(self, outcomes: list[Outcome]) -> None:
        """Queue outcomes for the next batch (one lock round for all of them)."""
        # A failed task without a lease to release leaves nothing to tell Redis: it stays pending.
        wanted = [o for o in outcomes if o.kind != RETRY or o.release is not None]
        if not wanted:
            return
        with self._cond:
            if self._closed:
                return  # after the drain deadline nothing more is acked: it stays pending
            overflow = len(self._pending) + len(wanted) - MAX_UNSETTLED
            for _ in range(min(max(0, overflow), len(self._pending))):
                self._pending.popleft()
                self._dropped += 1
                if self._dropped == 1 or self._dropped % 1000 == 0:
                    logger.warning(
                        "%d acks dropped during a long outage; those tasks will be redelivered", self._dropped
                    )
            self._pending.extend(wanted)
            if self._idle_waiting:  # wake the settler only when it sleeps: a notify per task is costly
                self._cond.notify_all()

    def unsettled_ids(self) -> set[str]:
        """Ids whose outcome is queued or being sent right now."""
        with self._cond:
            return {o.message_id for o in self._pending} | {o.message_id for o in self._batch}

    @property
    def backlog(self) -> int:
        with self._cond:
            return len(self._pending)

    def redis_ok(self) -> None:
        """The owner saw Redis answer again: retry kept outcomes now."""
        with self._cond:
            self._healthy = True
            self._cond.notify_all()

    def flush(self, timeout_s: float) -> bool:
        """Wait until everything put so far is settled, at most ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._pending or self._busy:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._healthy:
                    return not self._pending and not self._busy
                self._cond.wait(min(remaining, 0.05))
            return True

    def close(self) -> None:
        """Refuse further outcomes and let the thread end once idle."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    _busy = False

    def _take_batch(self) -> list[Outcome] | None:
        with self._cond:
            while not self._pending or not self._healthy:
                if self._closed:
                    return None
                self._idle_waiting = True
                self._cond.wait(0.5)
                self._idle_waiting = False
            batch = [self._pending.popleft() for _ in range(min(SETTLE_BATCH, len(self._pending)))]
            self._busy = True
            self._batch = batch
            return batch

    def _run(self) -> None:
        while True:
            batch = self._take_batch()
            if batch is None:
                return
            acks = [o.message_id for o in batch if o.kind == ACK]
            dead = [o.dead for o in batch if o.kind == DEAD and o.dead is not None]
            releases = [o.release for o in batch if o.release is not None]
            try:
                self._queue.settle(acks, dead, releases)
            except Exception as exc:
                with self._cond:
                    # Keep them, oldest first, for a retry once the owner sees Redis again.
                    self._pending.extendleft(reversed(batch))
                    self._healthy = False
                    self._busy = False
                    self._batch = []
                    self._cond.notify_all()
                self._on_failure(exc)
                continue
            with self._cond:
                self._busy = False
                self._batch = []
                self.settled += len(acks)
                self.dead_lettered += len(dead)
                self._cond.notify_all()
