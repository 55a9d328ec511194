"""Named tasks (Celery/arq habits): a ``TaskRegistry`` of functions routed by name, the worker's
runner of them (retries with backoff, results kept for a TTL) and the producer, ``TaskClient``.

Layer: beside ``plaita.flows`` (above the runtime and the store, below ops)."""

from plaita.tasking.errors import TaskFailed, TaskResultTimeout, UnknownTask, UnknownTaskResult
from plaita.tasking.registry import TaskDef, TaskRegistry, load_task_registry

__all__ = [
    "TaskDef",
    "TaskFailed",
    "TaskRegistry",
    "TaskResultTimeout",
    "UnknownTask",
    "UnknownTaskResult",
    "load_task_registry",
]
