"""The run of one task on one execution, and its fenced checkpoint write."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from plaita.errors import PlaitaError
from plaita.flows import model
from plaita.flows.definition import Flow, Step
from plaita.store.executions import ExecutionStore, Staged
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


def encode(doc: dict[str, Any]) -> str:
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":"))


async def call_io(offload: bool, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """A blocking Redis call: on a thread when running on the caller's loop, else directly."""
    if offload:
        return await asyncio.to_thread(fn, *args, **kwargs)
    return fn(*args, **kwargs)


class Checkpointer:
    """Writes a run's state with one fenced call; LeaseLostError when the lease moved on."""

    def __init__(
        self,
        store: ExecutionStore,
        *,
        retention_s: int,
        max_state_bytes: int,
        clock: Callable[[], float],
        on_saved: Callable[[Run, str], None] | None = None,
    ) -> None:
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
        text = encode(doc)
        size = len(text.encode("utf-8"))
        if size > self.max_state_bytes and status != "error":
            message = model.make_too_large(doc, size, self.max_state_bytes, step.name if step else None)
            logger.error("execution %s: %s", run.task.execution_id, message)
            status, staged, deadline_s, text = "error", None, None, encode(doc)
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
        if not ok:
            raise LeaseLostError(
                f"checkpoint of execution {run.task.execution_id} refused: lease generation "
                f"{run.task.fencing_token} is no longer current"
            )
        run.cancel = run.cancel or cancel
        if self.on_saved is not None:
            self.on_saved(run, status)
