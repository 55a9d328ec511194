"""The fenced checkpoint write: one document, its status and a step's staged writes, all or nothing.

What is written is decided by the execution's transitions (``plaita.flows.model.execution``) and
sealed here (``sealed``: the document, or the ``error`` one replacing a document that cannot be
written), with the deadline its index keeps (``Checkpointer.put``); this module makes the call
and turns its refusals into the errors the step loop handles. The step loop calls it once per
checkpoint, and the call goes down to the store adapter once and comes back.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from plaita.errors import ConfigError, LeaseLostError, PlaitaError
from plaita.flows.io import ExecutionIO
from plaita.flows.model import inbox
from plaita.flows.model.execution import Execution
from plaita.flows.model.validate import StepOutputError, output_error
from plaita.store.executions.staged import MAX_SECONDS
from plaita.store.executions.store import Staged, StagedWriteRefused
from plaita.tasks import Task

logger = logging.getLogger(__name__)


class CancelledMeanwhile(PlaitaError):
    """A ``completed`` checkpoint refused because a cancel was requested while the last step ran
    (the script checks the flag): nothing was written; the execution ends ``cancelled`` instead."""


class Checkpointer:
    """Writes an execution's document with one fenced call: LeaseLostError when the lease moved
    on, StepOutputError when a staged write Redis would refuse, CancelledMeanwhile when a
    ``completed`` one is refused because of a cancel (in all three nothing was written)."""

    def __init__(self, *, retention_s: int, max_state_bytes: int, index_keep_s: int | None = None) -> None:
        if not 0 <= retention_s <= MAX_SECONDS:  # EXPIRE must not fail after the state is written
            raise ConfigError(f"retention_s must be between 0 (keep forever) and {MAX_SECONDS} s, got {retention_s}")
        self.retention_s = retention_s
        #: Status index entries are kept this long (the longest retention of the flows run here).
        self.index_keep_s = index_keep_s
        self.max_state_bytes = max_state_bytes

    async def put(
        self,
        io: ExecutionIO,
        task: Task,
        execution: Execution,
        *,
        now_s: float,
        step: str | None,
        output: bool,
        staged: Sequence[Staged],
        deadline_s: float | None,
        retention_s: int | None,
        after_running: bool = False,
    ) -> tuple[Execution, bool]:
        """Checkpoint ``execution`` stamped ``now_s`` (``sealed``: or the ``error`` one replacing
        it, without the step's writes or deadline): (what was written, cancel requested). A
        suspension keeps its wait's deadline, capped by the whole execution's (the keeper finds
        both by the same index). Raises as ``write``; nothing is written then."""
        wanted = execution.stamped(now_s)
        written, text = sealed(wanted, self.max_state_bytes, step, output=output)
        if written.status != wanted.status:  # replaced: none of the step's writes, no deadline
            logger.error("execution %s: %s", task.execution_id, (written.error or {}).get("message"))
            staged, deadline_s = (), None
        if written.status == "suspended" and deadline_s is None:  # still waiting (a resume kept): its deadline stays
            deadline_s = (written.suspension or {}).get("deadline")
        if written.inbox:  # resumes kept: logged if no wait can take them now
            inbox.left_over(written)
        if written.status == "suspended" and written.deadline_at is not None:
            deadline_s = written.deadline_at if deadline_s is None else min(deadline_s, written.deadline_at)
        cancel = await self.write(
            io,
            task,
            text,
            status=written.status,
            now_s=written.updated_at,
            staged=staged,
            deadline_s=deadline_s,
            step=step,
            retention_s=retention_s,
            after_running=after_running,
        )
        return written, cancel

    async def write(
        self,
        io: ExecutionIO,
        task: Task,
        document: str,
        *,
        status: str,
        now_s: float,
        staged: Sequence[Staged] = (),
        deadline_s: float | None = None,
        step: str | None = None,
        retention_s: int | None = None,
        after_running: bool = False,
    ) -> bool:
        """Write ``document`` under the task's lease; True when a cancel is requested.
        ``retention_s``: its flow's (``Flow.retention_s``); None: this checkpointer's default."""
        try:
            ok, cancel = await io.checkpoint(
                task,
                document,
                status=status,
                now_s=now_s,
                deadline_s=deadline_s,
                retention_s=self.retention_s if retention_s is None else retention_s,
                index_keep_s=self.index_keep_s,
                staged=staged,
                after_running=after_running,
            )
        except StagedWriteRefused as exc:
            raise StepOutputError("StagedWriteRefused", f"step {step!r}: {exc}; nothing was written") from None
        if not ok and cancel:
            raise CancelledMeanwhile(f"execution {task.execution_id}: cancelled while its last step ran")
        if not ok:
            raise LeaseLostError(
                f"checkpoint of execution {task.execution_id} refused: lease generation "
                f"{task.fencing_token} is no longer current"
            )
        return bool(cancel)


def sealed(execution: Execution, max_bytes: int, step: str | None, *, output: bool) -> tuple[Execution, str]:
    """(execution, document) a checkpoint writes: ``execution`` itself, or the ``error``
    execution replacing it when it cannot be written (``unwritable``, ``too_large``; an error
    over the limit is written anyway: it is the record of the failure). When ``output``
    (the checkpoint of a step's output), a value that is not JSON is the step's failure instead:
    StepOutputError, and nothing is written."""
    try:
        text = execution.encode()
    except (TypeError, ValueError, RecursionError):
        problem = output_error(execution.to_doc(), step)
        if output:
            raise problem from None
        execution = execution.unwritable(problem)
        text = execution.encode()
    size = len(text) if text.isascii() else len(text.encode("utf-8"))  # isascii: O(1), no copy
    if size > max_bytes and execution.status != "error":
        execution = execution.too_large(size, max_bytes, step)
        text = execution.encode()
    return execution, text
