"""The actions of the consuming states: one method per state, one bounded step each.

Each step issues its Redis calls and, when its state is done, fires the trigger that leaves
it. Redis errors pass through to the owner loop, which turns them into ``redis_failed``.
"""

from __future__ import annotations

import logging
import threading
import time

from plaita.clock import wall_s
from plaita.config import Settings
from plaita.fsm import Lifecycle
from plaita.runtime.counters import Counters
from plaita.runtime.intake import MIN_READ_AHEAD, Intake, ReadBatch
from plaita.runtime.outage import Outage
from plaita.runtime.reclaim import Reclaimer
from plaita.runtime.renewer import LeaseRenewer
from plaita.runtime.settler import Settler
from plaita.runtime.suspects import Suspects
from plaita.store.queue_access import crash_strikes_of
from plaita.store.streams.entries import Entry
from plaita.store.streams.queue import StreamQueue

logger = logging.getLogger(__name__)

#: Entries examined per residue sweep: one bounded XRANGE + XPENDING between two reads, so the
#: sweep of acked-but-undeleted entries never holds up consuming.
RESIDUE_SWEEP_BATCH = 256
#: Batches read ahead in one READING step at most (each while the previous one's leases are
#: acquired), so stop requests and reclaim passes are still looked at every few hundred tasks.
READ_AHEAD_MAX = 4


class ConsumePhases:
    """ENSURE_GROUP, RESUMING_OWN, RECLAIMING, ISOLATING and READING for one worker (owner thread only).

    ``judges``: the handler ends a crash suspect's execution itself (``plaita.runtime.suspects``)."""

    def __init__(
        self,
        settings: Settings,
        *,
        queue: StreamQueue,
        lifecycle: Lifecycle,
        intake: Intake,
        renewer: LeaseRenewer,
        settler: Settler,
        outage: Outage,
        counters: Counters,
        slot_freed: threading.Event,
        judges: bool = False,
    ) -> None:
        self.settings = settings
        self.queue = queue
        self.lifecycle = lifecycle
        self.intake = intake
        self.renewer = renewer
        self.settler = settler
        self.outage = outage
        self.counters = counters
        self.slot_freed = slot_freed
        self.group_seen = False
        self._own_cursor = "0"
        self._next_reclaim_at_s = 0.0
        self._next_housekeeping_at_s = 0.0
        self.suspects = Suspects(
            settings,
            queue=queue,
            lifecycle=lifecycle,
            intake=intake,
            strikes=crash_strikes_of(queue),
            judges=judges,
            slot_freed=slot_freed,
        )
        #: ISOLATING's step.
        self.isolate = self.suspects.step
        self.reclaimer = Reclaimer(settings, queue=queue, intake=intake, suspects=self.suspects, counters=counters)

    def ensure_group(self) -> None:
        created = self.queue.ensure_group()
        if created and self.group_seen:
            logger.warning(
                "consumer group %r on %r was missing (Redis restarted without its data?); recreated it",
                self.queue.group,
                self.queue.stream,
            )
        elif created:
            logger.info("created consumer group %r on stream %r", self.queue.group, self.queue.stream)
        self.group_seen = True
        self.settler.redis_ok()
        # RESUMING_OWN starts from the beginning of our pending list every time.
        self._own_cursor = "0"
        self.lifecycle.trigger("group_ready")

    def resume_own(self) -> None:
        """One page of this consumer's own pending entries; ``own_pending_done`` once empty.

        A restarted worker with a stable name resumes its own pending entries at once. After an
        outage the same scan finds entries whose read reply was lost. Work of ours still running
        or awaiting its ack is skipped: the snapshot is taken *before* the read, and an id is
        always in one of the two sets until its ack lands (put before forget).
        """
        free = self.intake.free_slots()
        if free <= 0:
            self._wait_for_slot()
            return
        # Leases a lost acquire reply left (say, a cluster pipeline that failed on one master only)
        # would refuse the very entries this scan re-reads, until their TTL: release them first.
        self.renewer.release_orphans()
        ours = self.intake.ours()
        page = self.queue.read_own_pending(self._own_cursor, free)
        self._read_succeeded()
        if not page:
            self._next_reclaim_at_s = 0.0  # the claim pass skipped until now runs at once
            self.suspects.own_scan_done()
            self.lifecycle.trigger("suspects_found" if self.suspects.pending else "own_pending_done")
            return
        self._own_cursor = page[-1].message_id
        # At process start, what a dead predecessor left is suspect: it runs alone in ISOLATING.
        own = [e for e in page if e.message_id not in ours]
        if own:
            logger.info("resuming %d of this consumer's own pending tasks", len(own))
        self.intake.accept(self.suspects.from_own_scan(own))

    def reclaim(self) -> None:
        """One bounded pass: move due delayed tasks onto the stream, claim abandoned entries (idle
        and unleased), then housekeeping."""
        self.renewer.release_orphans()
        # Every worker moves (an atomic script per partition): no single process is needed. On
        # the durable clock, so a test clock's three days pass at once.
        moved = self.queue.move_due(int(wall_s() * 1000))
        if moved:
            logger.info("moved %d due delayed task(s) onto the stream", moved)
        self.reclaimer.claim()
        now = time.monotonic()
        if now >= self._next_housekeeping_at_s:
            self._housekeeping()
            self._next_housekeeping_at_s = now + self.settings.housekeeping_interval_s
        self._next_reclaim_at_s = now + self.settings.reclaim_interval_s
        self.lifecycle.trigger("suspects_found" if self.suspects.pending else "reclaim_done")

    def _housekeeping(self) -> None:
        """Remove long-idle consumers with nothing pending, and acked-but-undeleted residue."""
        removed = self.queue.prune_consumers(int(self.settings.consumer_prune_idle_s * 1000))
        if removed:
            logger.info("removed %d idle consumer(s) with no pending entries: %s", len(removed), ", ".join(removed))
        swept = self.queue.sweep_residue(RESIDUE_SWEEP_BATCH)
        if swept:
            logger.info("deleted %d acked entries left in the stream (residue)", swept)

    def read(self) -> None:
        if time.monotonic() >= self._next_reclaim_at_s:
            self.lifecycle.trigger("reclaim_due")
            return
        free = self.intake.free_slots()
        if free <= 0:
            self._wait_for_slot()
            return
        entries = self.queue.read_new(free, self.settings.read_block_ms)
        self._read_succeeded()
        self.intake.backlog_seen = len(entries) >= free
        batch = self.intake.parse_batch(entries)
        for _ in range(READ_AHEAD_MAX):
            ahead = self._read_ahead(batch)
            if not ahead:
                break
            # The next batch was read before this one's acquire went out, so its reply was not
            # held up by the script; its parse now runs while redis-server runs the script.
            self.intake.send_acquire(batch)
            try:
                following = self.intake.parse_batch(ahead)
            except BaseException:
                self.intake.drop(batch)
                raise
            # Should this raise, ``following``'s leased tasks never asked for their leases: their
            # entries stay in our pending list, and RESUMING_OWN re-reads them after the outage.
            self.intake.start_leased(batch)
            batch = following
        self.intake.send_acquire(batch)
        self.intake.start_leased(batch)

    def _read_ahead(self, batch: ReadBatch) -> list[Entry]:
        """With a backlog, the next batch (no BLOCK) to parse while ``batch``'s leases are being
        acquired; [] when there is nothing to overlap (no leased task, no backlog, no room)."""
        if not batch.eager or not self.intake.backlog_seen or time.monotonic() >= self._next_reclaim_at_s:
            return []
        room = self.intake.free_slots(unstarted=len(batch.eager))
        if room < MIN_READ_AHEAD:
            return []
        try:
            entries = self.queue.read_new(room, 0)
        except Exception:
            # ``batch`` was read and is ours alone now: start it (or leave it to the orphan
            # release) before the read's error goes up.
            self.intake.send_acquire(batch)
            self.intake.start_leased(batch)
            raise
        self.intake.backlog_seen = len(entries) >= room
        return entries

    def _read_succeeded(self) -> None:
        """A read answered: the outage (if any) is over and the backoff starts from its base again.

        Only a read ends an outage, not a group check: with an ACL that allows XGROUP CREATE but
        refuses reads, "Redis is back" would otherwise be logged between every two refusals.
        """
        self.lifecycle.backoff.reset()
        ended = self.outage.end()
        if ended is not None:
            logger.info("Redis is back after %.1f s (%d retries); consuming again", *ended)

    def _wait_for_slot(self) -> None:
        self.slot_freed.wait(self.settings.read_block_ms / 1000)
        self.slot_freed.clear()
