"""The run of one task on one execution, and its fenced checkpoint write."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from plaita.errors import ConfigError, PlaitaError
from plaita.flows import model
from plaita.flows.definition import Flow, Step
from plaita.flows.validate import StepOutputError, dumps, output_error
from plaita.store.executions import ExecutionStore, Staged, StagedWriteRefused
from plaita.store.staged import MAX_SECONDS
from plaita.tasks import Task

logger = logging.getLogger(__name__)


class LeaseLostError(PlaitaError):
    """The worker lost the execution's lease mid-run: nothing more is written; the task stays
    pending and the lease's successor continues from the last checkpoint."""


@dataclass
class Run:
    """One task advancing one execution: ``doc`` is the state as it will be checkpointed."""

    task: Task
    flow: Flow
    doc: dict[str, Any]
    cancel: bool
    offload: bool
    #: A resume that arrived while the execution was still running (its worker had died):
    #: applied at the next suspension instead of being lost.
    pending: tuple[str, Any, str] | None = None

    def snapshot(self) -> tuple[dict[str, Any], tuple[str, Any, str] | None]:
        """What a step's output changes in place (the document's top level, its history and
        results, the pending resume), to put back when its checkpoint writes nothing."""
        doc = dict(self.doc)
        doc["history"] = list(doc.get("history") or [])
        doc["results"] = dict(doc.get("results") or {})
        return doc, self.pending

    def restore(self, saved: tuple[dict[str, Any], tuple[str, Any, str] | None]) -> None:
        self.doc, self.pending = saved


def encode(doc: dict[str, Any]) -> str:
    """The execution document as strict JSON (no NaN or Infinity: every parser must read it)."""
    return dumps(doc)


async def call_io(offload: bool, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """A blocking Redis call: on a thread when running on the caller's loop, else directly."""
    if offload:
        return await asyncio.to_thread(fn, *args, **kwargs)
    return fn(*args, **kwargs)


class Checkpointer:
    """Writes a run's state with one fenced call, all or nothing: LeaseLostError when the lease
    moved on, StepOutputError when the step's output cannot be written (nothing was)."""

    def __init__(
        self,
        store: ExecutionStore,
        *,
        retention_s: int,
        max_state_bytes: int,
        clock: Callable[[], float],
        on_saved: Callable[[Run, str], None] | None = None,
    ) -> None:
        if not 0 <= retention_s <= MAX_SECONDS:  # EXPIRE must not fail after the state is written
            raise ConfigError(f"retention_s must be between 0 (keep forever) and {MAX_SECONDS} s, got {retention_s}")
        self.store = store
        #: Told the status each checkpoint really wrote (an oversized state turns into error).
        self.on_saved = on_saved
        self.retention_s = retention_s
        self.max_state_bytes = max_state_bytes
        self._clock = clock

    async def save(
        self,
        run: Run,
        status: str,
        *,
        staged: list[Staged] | None = None,
        deadline_s: float | None = None,
        step: Step | None = None,
    ) -> None:
        doc = run.doc
        doc.update(status=status, updated_at=self._clock())
        name = step.name if step else None
        status, text = self._encode(doc, status, name, output=staged is not None)
        if len(text.encode("utf-8")) > self.max_state_bytes and status != "error":
            status, staged, deadline_s, text = "error", None, None, self._too_large(run, text, name)
        try:
            ok, cancel = await call_io(
                run.offload,
                self.store.checkpoint,
                run.task.execution_id,
                run.task.fencing_token,
                text,
                status=status,
                now_s=doc["updated_at"],
                deadline_s=deadline_s,
                retention_s=self.retention_s,
                staged=staged or (),
            )
        except StagedWriteRefused as exc:
            raise StepOutputError("StagedWriteRefused", f"step {name!r}: {exc}; nothing was written") from None
        if not ok:
            raise LeaseLostError(
                f"checkpoint of execution {run.task.execution_id} refused: lease generation "
                f"{run.task.fencing_token} is no longer current"
            )
        run.cancel = run.cancel or cancel
        if self.on_saved is not None:
            self.on_saved(run, status)

    def _too_large(self, run: Run, text: str, step: str | None) -> str:
        """The ``error`` document replacing a state over the limit (with none of its staged writes)."""
        message = model.make_too_large(run.doc, len(text.encode("utf-8")), self.max_state_bytes, step)
        logger.error("execution %s: %s", run.task.execution_id, message)
        return encode(run.doc)

    @staticmethod
    def _encode(doc: dict[str, Any], status: str, step: str | None, *, output: bool) -> tuple[str, str]:
        """(status, document) to write. A step's output (``output``) that is not strict JSON is a
        StepOutputError; any other checkpoint that cannot be written (a state stored before JSON
        was strict) ends the execution in ``error``, without its state, instead of failing forever."""
        try:
            return status, encode(doc)
        except (TypeError, ValueError, RecursionError):
            problem = output_error(doc, step)
            if output:
                raise problem from None
        error = model.error_doc(doc.get("step"), problem.kind, str(problem))
        doc.update(state={}, results={}, resume=None, status="error", error=error, ended_at=doc.get("updated_at"))
        return "error", encode(doc)
