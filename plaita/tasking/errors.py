"""What named tasks raise on purpose: every one a ``PlaitaError``."""

from __future__ import annotations

from plaita.errors import PlaitaError


class UnknownTask(PlaitaError):
    """A task name the registry does not have (enqueue of an unregistered function)."""


class UnknownTaskResult(PlaitaError):
    """No record of that task id: never enqueued on this queue, its result expired after its
    ``result_ttl_s``, or its task keeps no result."""


class TaskResultTimeout(PlaitaError):
    """The task had not finished when ``TaskClient.result``'s ``timeout_s`` passed."""

    retryable = True


class TaskFailed(PlaitaError):
    """The task failed for good (its last attempt raised): ``error_type`` and ``message`` are
    what its function raised, as recorded by the worker."""

    def __init__(self, task_id: str, error_type: str, message: str) -> None:
        super().__init__(f"task {task_id} failed: {error_type}: {message}")
        self.task_id = task_id
        self.error_type = error_type
        self.message = message
