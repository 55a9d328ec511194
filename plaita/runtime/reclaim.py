"""RECLAIMING's claim: every abandoned entry the pass can take, in bounded steps.

A step (``StreamQueue.claim_unleased``) claims entries idle past ``--claim-min-idle-ms`` whose
lease is absent. A live consumer's entries (a failed task awaiting redelivery) run in this
worker's handler slots, so at most the free slots of them are taken per pass. A dead consumer's
entries (silent for ``silent_ms``) are crash suspects (``plaita.runtime.suspects``): they wait in
memory, in our pending list, and run one at a time, so they need no free slot and the pass takes
all of them, step after step, until the pending list ends. Before, a pass took at most the free
slots of them too, and a dead worker's 94 tasks came back 8 per reclaim interval.
"""

from __future__ import annotations

import logging

from plaita.config import Settings
from plaita.runtime.counters import Counters
from plaita.runtime.intake import Intake
from plaita.runtime.suspects import Suspects, silent_ms
from plaita.store.streams.entries import Entry
from plaita.store.streams.queue import StreamQueue

logger = logging.getLogger(__name__)

#: Live consumers' entries claimed per pass at most, so a huge pending list never starves reading.
RECLAIM_BATCH = 100
#: Steps of one pass at most: a bound, not a policy (a step examines at least 100 entries).
MAX_STEPS = 1000


class Reclaimer:
    """The claim of one RECLAIMING pass (owner thread only); keeps the cursor between passes."""

    def __init__(
        self, settings: Settings, *, queue: StreamQueue, intake: Intake, suspects: Suspects, counters: Counters
    ) -> None:
        self.settings = settings
        self.queue = queue
        self.intake = intake
        self.suspects = suspects
        self.counters = counters
        self.cursor = "0-0"
        self._dead_ms = int(silent_ms(settings))

    def claim(self) -> int:
        """Claim until the pending list ends, or the free slots are spent and a step took no dead
        consumer's entry (with no slot free, a step takes only those); how many were claimed."""
        budget = min(self.intake.free_slots(), RECLAIM_BATCH)
        total = 0
        for _ in range(MAX_STEPS):
            claimed = self._step(max(0, budget))
            total += len(claimed)
            live = sum(1 for e in claimed if not self._dead(e))
            budget -= live
            if self.cursor == "0-0" or (budget <= 0 and live == len(claimed)):
                break
        return total

    def _dead(self, entry: Entry) -> bool:
        return entry.owner_idle_ms is not None and entry.owner_idle_ms >= self._dead_ms

    def _step(self, budget: int) -> list[Entry]:
        ours = self.intake.ours()
        self.cursor, claimed, skipped = self.queue.claim_unleased(
            self.cursor, self.settings.claim_min_idle_ms, budget, dead_ms=self._dead_ms
        )
        # Our own finished work whose ack is still queued (say, across an outage) may look
        # abandoned: claimed back to us is harmless, running it again is not.
        claimed = [e for e in claimed if e.message_id not in ours]
        if skipped:
            logger.debug("reclaim skipped %d idle entries whose executions are still leased", skipped)
        if claimed:
            logger.info(
                "reclaimed %d abandoned task(s): %s",
                len(claimed),
                ", ".join(f"{e.message_id} (delivery {e.delivery_count})" for e in claimed[:10]),
            )
            # A dead consumer's tasks are suspects (ISOLATING, counted here); a live one's failed
            # tasks run as usual.
            usual = self.suspects.from_claim(claimed)
            self.counters.add("reclaimed", self.intake.accept(usual) + len(claimed) - len(usual))
        return claimed
