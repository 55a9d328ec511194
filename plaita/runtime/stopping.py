"""STOPPING: hand back what never started, drain what runs (bounded), hand back the rest."""

from __future__ import annotations

import logging
import threading
import time

from plaita.config import Settings
from plaita.runtime.counters import Counters
from plaita.runtime.inflight import InFlight, InFlightTable
from plaita.runtime.pool import Pool
from plaita.runtime.settler import Settler
from plaita.store.streams.queue import StreamQueue

logger = logging.getLogger(__name__)

#: Longest wait for pending acks to reach Redis while stopping. With a healthy Redis a flush
#: takes milliseconds; with a frozen one the acks are lost anyway (the tasks are redelivered),
#: and an idle worker must still exit within a second.
STOP_FLUSH_TIMEOUT_S = 0.3


class Drainer:
    """The work of the STOPPING state, run once by the owner thread."""

    def __init__(
        self,
        settings: Settings,
        *,
        queue: StreamQueue,
        pool: Pool,
        inflight: InFlightTable,
        settler: Settler,
        counters: Counters,
        stop_now: threading.Event,
    ) -> None:
        self.settings = settings
        self.queue = queue
        self.pool = pool
        self.inflight = inflight
        self.settler = settler
        self.counters = counters
        self.stop_now = stop_now

    def drain(self) -> None:
        unstarted = self.pool.take_unstarted()
        unstarted_items = self.inflight.pop(t.message_id for t in unstarted)
        if self.stop_now.is_set():
            # Stop now: one bounded hand-back of everything, nothing to wait for.
            left = self.inflight.abandon_all()
            self.hand_back(unstarted_items + left, "read but not finished (stop now)")
        else:
            self._drain_gracefully(unstarted_items)
        self.settler.close()
        if not self.settler.flush(STOP_FLUSH_TIMEOUT_S) and self.settler.backlog:
            logger.warning(
                "%d ack(s) could not reach Redis before exit; those tasks will be redelivered", self.settler.backlog
            )

    def _drain_gracefully(self, unstarted_items: list[InFlight]) -> None:
        running = self.pool.busy
        if running:
            logger.info(
                "stopping: draining %d running task(s), up to %.1f s (signal again to stop now)",
                running,
                self.settings.drain_timeout_s,
            )
        # Hand back unstarted work at once so other workers need not wait for the drain.
        self.hand_back(unstarted_items, "read but not started")
        deadline = time.monotonic() + self.settings.drain_timeout_s
        if not self.pool.wait_idle(deadline, self.stop_now):
            left = self.inflight.abandon_all()  # a late finish must not ack: handed back
            logger.warning("drain ended with %d task(s) still running", len(left))
            self.hand_back(left, "still running at the drain deadline")

    def hand_back(self, items: list[InFlight], what: str) -> None:
        """Give tasks back to the group without charging a delivery (best effort)."""
        if not items:
            return
        entries = [(i.task.message_id, i.fields) for i in items]
        releases = [(i.lease.key, i.lease.value) for i in items if i.lease is not None]
        try:
            self.queue.hand_back(entries, releases)
        except Exception as exc:
            logger.warning(
                "could not hand back %d task(s) %s (%s: %s); they stay pending for this consumer",
                len(items),
                what,
                type(exc).__name__,
                exc,
            )
            return
        self.counters.add("handed_back", len(items))
        logger.info("handed back %d task(s) %s", len(items), what)
