"""Tasks a handler says are not for this worker (``NotForThisWorker``): handed back, or left.

A hand-back gives the entry back to the group at once without charging a delivery (XNACK, or
re-add + ack in one transaction: ``StreamQueue.hand_back``), so the worker that can run it reads
it next. The handler bounds how often one task may be handed back (``hand_back`` False past
that): the task is then left pending like a failed delivery, so it cannot bounce forever.
"""

from __future__ import annotations

import logging
import time

from plaita.errors import NotForThisWorker
from plaita.runtime.outcomes import HANDBACK, RETRY, Outcome
from plaita.tasks import Task

logger = logging.getLogger(__name__)


def not_for_this_worker(task: Task, exc: NotForThisWorker, max_deliveries: int) -> Outcome:
    """The outcome of a task its handler cannot run here (the handler logged why)."""
    if exc.hand_back:
        return Outcome(task.message_id, HANDBACK, not_before_s=time.monotonic() + max(0.0, exc.delay_s))
    if task.delivery_count >= max_deliveries:
        logger.error(
            "task %s could not be run by any worker that read it (%d deliveries): moved to the DLQ (%s)",
            task.message_id,
            task.delivery_count,
            exc.reason,
        )
        return Outcome.to_dlq(task.message_id, exc.reason, task.delivery_count, task.body)
    logger.warning(
        "task %s left pending for redelivery (delivery %d of %d): %s",
        task.message_id,
        task.delivery_count,
        max_deliveries,
        exc.reason,
    )
    return Outcome(task.message_id, RETRY)
