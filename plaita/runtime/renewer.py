"""Keeping this worker's tasks visibly alive, so no other worker reclaims live work.

``LeaseRenewer`` is the renewer thread: every interval it extends the leases of the tasks in
flight (``plaita.runtime.inflight``; compare-and-extend), resets their entries' idle time
(XCLAIM JUSTID to ourselves), takes the lazy lease of a long task keyed by its message id, and
declares a lease lost when Redis says another holder has it or when it could not be renewed for
a whole TTL. A lost task's handler is cancelled and its outcome is never acked. It also releases
orphan leases: ones a lost acquire reply may have set after an outage.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from plaita.runtime.inflight import InFlight, InFlightTable, lease_ref
from plaita.store.leases import LeaseManager
from plaita.store.streams.queue import StreamQueue

logger = logging.getLogger(__name__)


class LeaseRenewer:
    """The renewer thread of one worker."""

    def __init__(
        self,
        table: InFlightTable,
        leases: LeaseManager,
        stream_queue: StreamQueue,
        *,
        owner_leases: LeaseManager | None = None,
        ttl_s: float,
        claim_min_idle_ms: int,
        on_lost: Callable[[InFlight], None],
    ) -> None:
        self.table = table
        self.leases = leases
        self.queue = stream_queue
        #: ``release_orphans`` runs on the owner thread: it uses the owner's pool.
        self.owner_leases = owner_leases if owner_leases is not None else leases
        self.ttl_s = ttl_s
        # Renew often enough that neither the lease (ttl) nor the entry's idle time
        # (claim_min_idle_ms) can run out between two renewals.
        self.interval_s = max(0.05, min(ttl_s, claim_min_idle_ms / 1000) / 3)
        self._on_lost = on_lost
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="plaita-renewer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.renew_once()
            except Exception as exc:
                logger.debug("lease renewal failed (%s: %s); retrying", type(exc).__name__, exc)
            self.expire_unrenewed()

    def renew_once(self) -> None:
        """One renewal round (also called by tests)."""
        now = time.monotonic()
        items = self.table.live()
        # Tasks without an execution id take their lease once they outlive a renewal interval.
        lazy = [i for i in items if i.lease is None and now - i.read_at_s >= self.interval_s]
        try:
            acquired = self.leases.acquire_many([i.task.execution_id for i in lazy], [i.task.keyspace for i in lazy])
        except Exception:
            self.table.suspect_orphans(lease_ref(i.task) for i in lazy)  # Redis may have set some
            raise
        for item, got in zip(lazy, acquired, strict=True):
            if isinstance(got, str):
                # Ours already (an earlier acquire whose reply was lost) and the task runs here: adopt it.
                got = self.leases.ours(item.task.execution_id, got, item.task.keyspace) or got
            if isinstance(got, str):
                self.lose(item, f"its message is leased by {got}")
            else:
                item.task.fencing_token, item.lease, item.renewed_at_s = got.generation, got, now
        fresh = {id(i) for i in lazy}  # just acquired: nothing to extend yet
        leased = [i for i in items if i.lease is not None and id(i) not in fresh]
        results = self.leases.renew_many([i.lease for i in leased if i.lease is not None])
        now = time.monotonic()
        for item, ok in zip(leased, results, strict=True):
            if ok:
                item.renewed_at_s = now
            elif ok is None:
                continue  # its server failed this round: expire_unrenewed judges it after a TTL
            elif not item.settling:  # a settling task's lease was released with its ack: not lost
                self.lose(item, "another worker holds it now or it expired")
        self.queue.renew_pending([i.task.message_id for i in items if not i.lost])

    def expire_unrenewed(self) -> None:
        """A lease not renewed for a whole TTL has expired in Redis: treat it as lost."""
        now = time.monotonic()
        for item in self.table.live():
            if item.lease is not None and not item.settling and now - item.renewed_at_s > self.ttl_s:
                self.lose(item, f"not renewed for {self.ttl_s:.0f} s (Redis unreachable)")

    def lose(self, item: InFlight, why: str) -> None:
        item.lost = True
        item.task.cancelled.set()
        self._on_lost(item)
        logger.error(
            "lost the lease of execution %s (task %s): %s; cancelling its handler, it will not be acked",
            item.task.execution_id,
            item.task.message_id,
            why,
        )

    def release_orphans(self) -> None:
        """Delete leases a lost acquire reply may have left, so their entries can be reclaimed.

        Call it on the owner thread, the only one that adds in-flight tasks, so an execution
        with no task in flight here cannot gain a live lease of ours meanwhile.
        """
        ready = self.table.take_orphan_suspects()
        try:
            for ref in sorted(ready, key=str):
                execution_id, keyspace = (ref, None) if isinstance(ref, str) else ref
                if self.owner_leases.release_orphan(execution_id, keyspace):
                    logger.info("released an orphan lease of execution %s (its acquire reply was lost)", execution_id)
                ready.discard(ref)
        finally:
            if ready:
                self.table.suspect_orphans(ready)
