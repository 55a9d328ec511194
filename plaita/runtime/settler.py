"""The settler thread: acks and dead-letters finished tasks in batches.

Outcomes go to one thread that settles them in one MULTI/EXEC round trip per batch, so a fast
handler is not held back by a round trip per task and a slow Redis never blocks a handler. A
failed batch is kept (bounded) and retried after the owner has seen Redis come back.

A batch lingers a little: once an outcome is queued the thread waits until ``ACK_LINGER_TASKS``
are queued or the oldest has waited ``ACK_LINGER_S``, whichever comes first, then sends what is
queued (one batch in flight while the next fills). At a low rate (one flow execution at a time)
an ack would otherwise go alone, a round trip per task. At a high rate there is no linger at
all: once a batch went out with ``ACK_LINGER_TASKS`` or more, the next goes as soon as the
previous is confirmed, as before the linger existed (batches fill while one is in flight). A
flush (a stop's final one) cuts the linger short. Acks are off every handler's path (the window
below is what a handler waits for), so the linger delays only when an entry leaves the pending
list and its lease is released, by at most ``ACK_LINGER_S``.

The ack window bounds what a kill -9 costs, with or without the linger. A handler takes a slot
of the window before it starts a task, and the slot comes back only when that task's ack is
confirmed (or its outcome needs none), so at any instant at most
``window`` tasks are running or finished-but-unconfirmed: a worker killed then re-runs at most
``--concurrency`` + ``ACK_WINDOW`` tasks. With Redis away the window fills and handlers wait
instead of piling up finished work that would all run again.
"""

from __future__ import annotations

import collections
import enum
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace

from plaita.runtime.outcomes import ACK, DEAD, HANDBACK, RETRY, Outcome
from plaita.store.streams.entries import DeadLetter
from plaita.store.streams.queue import StreamQueue

logger = logging.getLogger(__name__)

#: Settled-but-not-yet-acked outcomes kept across an outage; past this the oldest are
#: dropped (they stay pending in Redis and are redelivered: at-least-once holds).
MAX_UNSETTLED = 50_000
#: Most outcomes settled in one MULTI/EXEC.
SETTLE_BATCH = 500
#: Finished tasks whose ack may be unconfirmed at once, beyond the running ones (the window is
#: ``--concurrency`` + this): the bound on tasks a kill -9 makes run again.
ACK_WINDOW = 256
#: Longest wait of a queued outcome for others to share its batch (see the module docstring).
ACK_LINGER_S = 0.002
#: Queued outcomes that end the linger at once (capped by ``SETTLE_BATCH``).
ACK_LINGER_TASKS = 64


class Phase(enum.Enum):
    """What the settler thread is doing (changed under the condition: by the thread, and out of
    HELD by the owner's ``redis_ok``)."""

    #: Nothing to send: asleep on the condition until an outcome arrives (``put_many`` wakes it).
    IDLE = "idle"
    #: Outcomes are queued and wait, at most the linger, for more to share their batch
    #: (``put_many`` wakes it only once the count is reached; ``flush`` and ``close`` at once).
    LINGERING = "lingering"
    #: A batch is on its way to Redis (``flush`` waits for it).
    SENDING = "sending"
    #: The last batch failed: its outcomes are kept, and nothing is sent until ``redis_ok``.
    HELD = "held"


class Settler:
    """The thread that acks and dead-letters finished tasks in batches."""

    def __init__(
        self,
        stream_queue: StreamQueue,
        *,
        on_failure: Callable[[BaseException], None],
        max_defer_s: float = 1.0,
        on_dead: Callable[[list[DeadLetter]], None] | None = None,
        window: int = ACK_WINDOW,
        linger_s: float = ACK_LINGER_S,
    ) -> None:
        self._queue = stream_queue
        self.linger_s = linger_s
        #: When the oldest queued outcome was queued (monotonic), for the linger.
        self._oldest_s = 0.0
        #: Outcomes in the last batch sent: one of ``ACK_LINGER_TASKS`` or more means a high rate,
        #: where batches fill while the previous one is in flight and a linger only adds waits.
        self._last_batch_n = 0
        #: Callers of ``flush`` waiting now: while any waits, nothing lingers.
        self._flushers = 0
        #: Told the dead letters each batch wrote to the DLQ (alerts); must not block.
        self._on_dead = on_dead
        #: Slots of the ack window (see the module docstring); ``_open`` of them are taken: by
        #: handlers (running or finished, not yet routed) and by every outcome queued or in flight.
        self.window = window
        self._open = 0
        self._room_listeners: list[Callable[[], None]] = []
        self._room_wanted = False
        #: Longest wait of a deferred hand-back: well within the lease it holds meanwhile.
        self.max_defer_s = max_defer_s
        self._on_failure = on_failure
        self._cond = threading.Condition()
        self._pending: collections.deque[Outcome] = collections.deque()
        #: Outcomes waiting for their ``not_before_s`` (a few hand-backs at most).
        self._deferred: list[Outcome] = []
        self._phase = Phase.IDLE
        #: The owner's one-way decision to refuse new outcomes (``close``); it is no phase of
        #: the thread's, which may still be sending or held when the owner closes.
        self._closed = False
        self._dropped = 0
        #: The batch being sent (SENDING), for ``unsettled_ids``.
        self._batch: list[Outcome] = []
        self._thread = threading.Thread(target=self._run, name="plaita-settler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def phase(self) -> Phase:
        with self._cond:
            return self._phase

    def put(self, outcome: Outcome) -> None:
        self.put_many([outcome])

    def put_many(self, outcomes: list[Outcome]) -> None:
        """Queue outcomes for the next batch (one lock round for all of them)."""
        # A failed task without a lease to release leaves nothing to tell Redis: it stays pending.
        # One pass (no generator per outcome): this runs for every finished task.
        wanted: list[Outcome] = []
        waits = False
        for o in outcomes:
            if o.kind != RETRY or o.release is not None:
                wanted.append(o)
                if o.not_before_s:
                    waits = True
        if not wanted:
            return
        with self._cond:
            if self._closed:
                return  # after the drain deadline nothing more is acked: it stays pending
            self._open += len(wanted)
            overflow = len(self._pending) + len(wanted) - MAX_UNSETTLED
            if overflow > 0:
                self._drop_oldest(overflow)
            if not self._pending:
                self._oldest_s = time.monotonic()
            if waits:
                self._defer(wanted)
            else:  # no hand-back waits: every outcome goes to the next batch
                self._pending.extend(wanted)
            # Wake it only when it may sleep, and while it lingers only once the count ends the
            # linger: a notify per task is costly.
            phase = self._phase
            if (
                phase is Phase.IDLE
                or phase is Phase.HELD
                or (phase is Phase.LINGERING and len(self._pending) >= self._linger_tasks())
            ):
                self._cond.notify_all()

    def _drop_oldest(self, overflow: int) -> None:
        """Drop the ``overflow`` oldest queued outcomes (lock held): a long outage filled the queue."""
        for _ in range(min(overflow, len(self._pending))):
            self._pending.popleft()
            self._open -= 1
            self._dropped += 1
            if self._dropped == 1 or self._dropped % 1000 == 0:
                logger.warning("%d acks dropped during a long outage; those tasks will be redelivered", self._dropped)

    # -- the ack window ----------------------------------------------------------------------
    def take(self, n: int, *, block: bool = True) -> int:
        """Take up to ``n`` slots of the ack window, one per task about to start; how many were
        taken (at least 1 when ``block``: waits while the window is full). Never waits once closed:
        nothing is acked any more, so there is nothing left to bound."""
        with self._cond:
            while not self._closed:
                room = self.window - self._open
                if room > 0:
                    taken = min(n, room)
                    self._open += taken
                    return taken
                self._room_wanted = True
                if not block:
                    return 0
                self._cond.wait(0.5)
            return n

    def give_back(self, n: int) -> None:
        """Return ``n`` slots: unused ones, or those of finished tasks already routed (``put_many``
        took a slot of its own for each outcome it queued)."""
        if n:
            self._free(n)

    def on_room(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` (on the settler's or a handler's thread) when slots come back after a
        ``take(block=False)`` found none: how an event loop learns it may start tasks again."""
        self._room_listeners.append(listener)

    def _free(self, n: int) -> None:
        """``n`` slots come back; wake whoever waits for slots (one lock round; listeners are
        called with the lock not held)."""
        with self._cond:
            self._open -= n
            if not self._room_wanted or self._open >= self.window:
                return
            self._room_wanted = False
            self._cond.notify_all()
        for listener in self._room_listeners:
            listener()

    def _room_made(self) -> None:
        """Wake whoever waits for slots (lock not held)."""
        self._free(0)

    def _confirmed(self, n: int) -> None:
        """``n`` outcomes reached Redis: their slots come back."""
        self._free(n)

    def _defer(self, wanted: list[Outcome]) -> None:
        """Queue ``wanted``, holding those whose ``not_before_s`` is still ahead (lock held)."""
        now = time.monotonic()
        latest_s = now + self.max_defer_s
        wanted = [o if o.not_before_s <= latest_s else replace(o, not_before_s=latest_s) for o in wanted]
        self._deferred += [o for o in wanted if o.not_before_s > now]
        self._pending.extend(o for o in wanted if o.not_before_s <= now)

    def unsettled_ids(self) -> set[str]:
        """Ids whose outcome is queued or being sent right now."""
        with self._cond:
            return {o.message_id for o in (*self._pending, *self._batch, *self._deferred)}

    @property
    def backlog(self) -> int:
        with self._cond:
            return len(self._pending) + len(self._deferred)

    def redis_ok(self) -> None:
        """The owner saw Redis answer again: retry kept outcomes now."""
        with self._cond:
            if self._phase is Phase.HELD:
                self._phase = Phase.IDLE
            self._cond.notify_all()

    def flush(self, timeout_s: float) -> bool:
        """Wait until everything put so far is settled, at most ``timeout_s`` (no lingering
        meanwhile: what is queued goes at once)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self._flushers += 1
            self._cond.notify_all()
            try:
                while self._pending or self._phase is Phase.SENDING:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0 or self._phase is Phase.HELD:
                        return False
                    self._cond.wait(min(remaining, 0.05))
                return True
            finally:
                self._flushers -= 1

    def close(self) -> None:
        """Refuse further outcomes and let the thread end once idle (deferred ones go now)."""
        with self._cond:
            self._closed = True
            self._pending.extend(self._deferred)
            self._deferred.clear()
            self._cond.notify_all()

    def _promote_due(self) -> float:
        """Move deferred outcomes whose time has come to the queue (lock held); how long to
        wait for the next one at most."""
        if not self._deferred:
            return 0.5
        now = time.monotonic()
        self._pending.extend(o for o in self._deferred if o.not_before_s <= now)
        self._deferred = [o for o in self._deferred if o.not_before_s > now]
        return min([0.5, *(o.not_before_s - now for o in self._deferred)])

    @staticmethod
    def _linger_tasks() -> int:
        return min(ACK_LINGER_TASKS, SETTLE_BATCH)

    def _linger_left_s(self) -> float:
        """How much longer the queued outcomes may wait for company (lock held); 0: send now."""
        linger_tasks = self._linger_tasks()
        if self._closed or self._flushers or len(self._pending) >= linger_tasks or self._last_batch_n >= linger_tasks:
            return 0.0
        return self._oldest_s + self.linger_s - time.monotonic()

    def _take_batch(self) -> list[Outcome] | None:
        with self._cond:
            while True:
                wait_s = self._promote_due()
                if self._pending and self._phase is not Phase.HELD:
                    linger_s = self._linger_left_s()
                    if linger_s <= 0:
                        break
                    self._phase = Phase.LINGERING
                    wait_s = min(wait_s, linger_s)
                elif self._closed:
                    return None
                self._cond.wait(wait_s)
            batch = [self._pending.popleft() for _ in range(min(SETTLE_BATCH, len(self._pending)))]
            # What is left waited at least as long as the batch (and is a full batch's worth).
            self._oldest_s = time.monotonic()
            self._last_batch_n = len(batch)
            self._phase = Phase.SENDING
            self._batch = batch
            return batch

    def _run(self) -> None:
        while True:
            batch = self._take_batch()
            if batch is None:
                return
            size = len(batch)
            try:
                batch = self._hand_back(batch)
                acks = [o.message_id for o in batch if o.kind == ACK]
                dead = [o.dead for o in batch if o.kind == DEAD and o.dead is not None]
                releases = [o.release for o in batch if o.release is not None]
                refused = self._queue.settle(acks, dead, releases)
            except Exception as exc:
                with self._cond:
                    # Keep them, oldest first, for a retry once the owner sees Redis again.
                    self._pending.extendleft(reversed(batch))
                    self._phase = Phase.HELD
                    self._batch = []
                    self._open -= size - len(batch)  # hand-backs that went through are settled
                    self._cond.notify_all()
                self._on_failure(exc)
                continue
            self._report_refused(refused)
            if dead and self._on_dead is not None:
                refused_ids = {id(d) for d, _ in refused}
                self._on_dead([d for d in dead if id(d) not in refused_ids])
            with self._cond:
                self._phase = Phase.IDLE
                self._batch = []
                self._open -= size
                self._cond.notify_all()
            self._room_made()

    def _hand_back(self, batch: list[Outcome]) -> list[Outcome]:
        """Hand back the batch's ``handback`` outcomes (one transaction with their lease
        releases); the rest of the batch. Raises with nothing handed back: the batch is kept."""
        back = [o for o in batch if o.kind == HANDBACK and o.fields is not None]
        if not back:
            return batch
        self._queue.hand_back(
            [(o.message_id, o.fields) for o in back if o.fields is not None],
            [o.release for o in back if o.release is not None],
            timeout_s=None,
        )
        with self._cond:
            self._batch = [o for o in self._batch if o.kind != HANDBACK]
        return [o for o in batch if o.kind != HANDBACK]

    @staticmethod
    def _report_refused(refused: list[tuple[DeadLetter, str]]) -> None:
        """Dead letters the DLQ key refused: they stay pending; the rest of the batch settled."""
        for d, error in refused:
            logger.error(
                "could not move task %s to the DLQ (%s): it stays pending and goes to the DLQ again at its next "
                "delivery; fix the DLQ key's type to let it through",
                d.message_id,
                error[:200],
            )
