"""A task of a flow with fleet-wide limits passing them, for ``FlowRunner`` (``plaita.flows.engine``):
it takes the flow's slot (``plaita.flows.limits``), parks (a start finding every slot held) or
goes back to the queue. A start whose execution is already cancelled (its cancel flag set while
it waited) or past its deadline takes no slot and waits for none: it leaves the parked starts, is
created and ends ``cancelled`` without a step, so a cancel lands on a start waiting for a slot as
on any other queued start (``plaita.flows.cancel`` puts a parked start back on its stream).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from plaita.errors import BadTaskError, NotForThisWorker
from plaita.flows.definition import Flow
from plaita.flows.io import ExecutionIO
from plaita.flows.limits import FlowLimits
from plaita.flows.validate import task_deadline
from plaita.tasks import Task


class Throttle:
    """The runner's limit check (mixed into ``FlowRunner``)."""

    _limits: FlowLimits
    _clock: Callable[[], float]

    def _tell(self, name: str, *args: Any) -> None:
        raise NotImplementedError

    async def _enter(self, flow: Flow, task: Task, io: ExecutionIO, *, start: bool) -> bool:
        """Take the flow's slot: True to run. False: a start parked until a slot is free (its task
        ends here, counted ``parked``). Over a start rate, or a resume over the limit, the task
        goes back to the queue (NotForThisWorker, counted ``throttled``). A start that will end
        ``cancelled`` anyway passes at once."""
        if not self._limits.limited(flow, start=start):
            return True
        if start and await self._start_cancelled(io, task):
            await io.blocking(self._limits.forget, flow, task)
            return True
        try:
            entered = await io.blocking(self._limits.enter, flow, task, start=start)
        except NotForThisWorker:
            self._tell("execution_event", flow.flow_id, "throttled")
            raise
        if not entered:
            self._tell("execution_event", flow.flow_id, "parked")
        return entered

    async def _start_cancelled(self, io: ExecutionIO, task: Task) -> bool:
        """Whether ``task``'s start is past its deadline, or its cancel flag is set (one GET)."""
        try:
            deadline_at = task_deadline(task.body)
        except BadTaskError:  # its admission reports it (the DLQ)
            return False
        if deadline_at is not None and self._clock() >= deadline_at:
            return True
        return await io.cancel_requested(task)
