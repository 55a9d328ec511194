"""From finished handlers to the settler: count, attach lease releases, drop what was lost."""

from __future__ import annotations

import logging
import threading
from dataclasses import replace

from plaita.runtime.counters import CounterBook
from plaita.runtime.observer import Observers
from plaita.runtime.pool import Done
from plaita.runtime.renewer import InFlightTable
from plaita.runtime.settler import ACK, DEAD, HANDBACK, RETRY, Outcome, Settler

logger = logging.getLogger(__name__)


class OutcomeRouter:
    """Called on handler threads with the tasks each finished (a chunk, in order)."""

    def __init__(
        self,
        *,
        inflight: InFlightTable,
        settler: Settler,
        counters: CounterBook,
        observers: Observers,
        slot_freed: threading.Event,
    ) -> None:
        self.inflight = inflight
        self.settler = settler
        self.counters = counters
        self.observers = observers
        self.slot_freed = slot_freed

    def __call__(self, done: list[Done]) -> None:
        self.observers.tasks_finished([duration_s for _, _, duration_s in done])
        # Marked settling before the settler can release their leases (see LeaseRenewer).
        items = self.inflight.begin_settling(task.message_id for task, _, _ in done)
        outcomes: list[Outcome] = []
        counts = {"completed": 0, "failed": 0, "dead_lettered": 0, "handed_back": 0}
        for (task, outcome, _), item in zip(done, items, strict=True):
            if item is not None and item.lost:
                # A successor may own this entry now: acking or releasing would touch its delivery.
                logger.warning(
                    "task %s finished after it was handed back or lost its lease; not acked (its successor decides)",
                    task.message_id,
                )
                continue
            if outcome.kind == HANDBACK:
                # The entry's own fields go back on the stream (the re-add fallback needs them).
                fields = item.fields if item is not None else None
                outcome = replace(outcome, kind=HANDBACK if fields is not None else RETRY, fields=fields)
                counts["handed_back"] += 1
            elif outcome.kind == ACK:
                counts["completed"] += 1
            else:
                counts["failed"] += 1
                counts["dead_lettered"] += outcome.kind == DEAD
            if item is not None and outcome.dead is not None and outcome.dead.fields is None:
                # A handler's dead letter keeps the whole original entry too.
                outcome = Outcome(outcome.message_id, outcome.kind, replace(outcome.dead, fields=item.fields))
            lease = item.lease if item is not None else None
            if lease is not None:
                outcome = replace(outcome, release=(lease.key, lease.value))
            outcomes.append(outcome)
        for name, n in counts.items():
            self.counters.add(name, n)
        # Settler first, then out of the in-flight map: at every instant the id is in one of the
        # two, so no scan of our own pending list can mistake finished work for abandoned work.
        self.settler.put_many(outcomes)
        self.inflight.pop(task.message_id for task, _, _ in done)
        self.slot_freed.set()
