"""What a worker does to a start it holds but does not run: the producer's ``queued`` record.

Two cases, both under the start's lease (the record is rewritten by a fenced script, and only while
it is still ``queued``: ``plaita.store.executions.queued``):

* **Waiting for a version.** A start asking for a flow version no live worker runs is not
  dead-lettered at once: during a deploy the worker that runs it may register a minute later. It is
  handed back (``NotForThisWorker``, no delivery charged) with a delay that doubles from
  ``HANDOVER_DELAY_S`` up to ``VERSION_WAIT_MAX_DELAY_S`` (the worker caps it below its lease TTL),
  its record shows ``waiting`` (the version, since, until), until a worker that runs the version
  takes it, or for at most ``version_wait_s`` (``--version-wait-s``) from the first time a worker
  found it: then it goes to the DLQ with the reason. The time it began to wait is kept in Redis
  (``Keyspace.version_wait_key``), so every worker of the fleet counts from the same moment.
* **Dead-lettered.** A start that goes to the DLQ before a worker created its execution (unknown
  flow, bad params, the version wait over) ends its record ``error`` (type ``DeadLettered``, the
  reason), kept like any ended execution (retention), so ``wait`` returns instead of timing out. A
  ``plaita dlq requeue`` of the start is created over it as over a queued record.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable

from plaita.errors import NotForThisWorker
from plaita.flows.io import ExecutionIO
from plaita.flows.model.execution import BadExecution, Execution
from plaita.flows.runner.handover import HANDOVER_DELAY_S
from plaita.store.executions.execution_docs import UnreadableExecution
from plaita.store.executions.store import QUEUED
from plaita.tasks import Task

logger = logging.getLogger(__name__)

#: The longest pause between two hand-backs of a waiting start (the worker caps it at a third of
#: its lease TTL): a wait of an hour costs a re-add every few seconds, not a busy loop.
VERSION_WAIT_MAX_DELAY_S = 5.0
#: The wait record outlives the wait by this much (renewed at each hand-back), so a late worker
#: still finds when it began.
VERSION_WAIT_SLACK_S = 600.0


class QueuedStarts:
    """The queued records of the starts, as their admission sees them through the runner's door."""

    def __init__(self, io: ExecutionIO, *, version_wait_s: float, retention_s: int, clock: Callable[[], float]) -> None:
        self.io = io
        self.version_wait_s = version_wait_s
        self.retention_s = retention_s
        self._clock = clock

    async def wait_for_version(self, task: Task, flow_id: str, version: str) -> str:
        """Hand ``task`` back (NotForThisWorker) while its version wait lasts; once it is over,
        the reason to dead-letter it with (the caller raises BadTaskError)."""
        eid, now_s = task.execution_id, self._clock()
        since_s, n = await self.io.version_wait(task, now_s, self.version_wait_s + VERSION_WAIT_SLACK_S)
        until_s = since_s + self.version_wait_s
        what = f"flow {flow_id!r} version {version!r} requested; no live worker runs it"
        if now_s >= until_s:
            await self.io.forget_version_wait(task)  # a requeue from the DLQ waits afresh
            return f"{what} (waited {self.version_wait_s:.0f} s, --version-wait-s)"
        if n == 1:
            logger.info("start of execution %s: %s: waiting for one until %s", eid, what, _utc(until_s))
            await self._rewrite(task, lambda ex: ex.waiting_for_version(version, since_s, until_s, now_s), QUEUED, 0)
        delay_s = min(VERSION_WAIT_MAX_DELAY_S, HANDOVER_DELAY_S * 2 ** min(n - 1, 16))
        raise NotForThisWorker(f"{what}: waiting for one until {_utc(until_s)}", delay_s=delay_s)

    async def dead_lettered(self, task: Task, reason: str) -> None:
        """End the start's queued record ``error`` with ``reason`` (its task goes to the DLQ)."""
        now_s = self._clock()
        if await self._rewrite(task, lambda ex: ex.dead_lettered(reason, now_s), "error", self.retention_s):
            logger.info("start of execution %s dead-lettered: its queued record ended error", task.execution_id)

    async def _rewrite(
        self, task: Task, change: Callable[[Execution], Execution], status: str, retention_s: int
    ) -> bool:
        """``change`` applied to the queued record, written under the lease; False when there is
        none (an older producer's start, or a worker took it over) or it cannot be read."""
        eid = task.execution_id
        try:
            doc = await self.io.get(task, eid)
            if doc is None or doc.get("status") != QUEUED:
                return False
            text = change(Execution.decode(doc)).encode()
        except (UnreadableExecution, BadExecution, TypeError, ValueError):
            return False  # left for an operator: the task's own outcome is reported anyway
        return await self.io.rewrite_queued(task, text, status, self._clock(), retention_s)


def _utc(epoch_s: float) -> str:
    return datetime.datetime.fromtimestamp(epoch_s, tz=datetime.UTC).isoformat(timespec="seconds")
