"""A registry of named tasks, and how a stream body names one. Pure: no Redis.

Two body shapes run a task:

- ``{"type": "task", "task": "send_email", "args": [...], "kwargs": {...}, "task_id": "..."}``:
  what ``TaskClient.enqueue`` writes;
- ``{"type": "send_email", "to": "a@b.c"}``: any other ``type`` names the task, and the body's
  other fields are its keyword arguments, less the envelope fields (``ENVELOPE_FIELDS``).

``attempt`` (1 for the first run) is written by the worker on a retry.
"""

from __future__ import annotations

import importlib
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple, overload

from plaita.errors import BadTaskError, ConfigError
from plaita.tasks import TASK_TYPES, short_repr

#: The ``type`` of a body that names its task in ``task``.
NAMED_TYPE = "task"
#: Body fields that are the envelope, never a keyword argument of a ``type``-routed task.
ENVELOPE_FIELDS = frozenset({"type", "task_id", "attempt", "execution_id", "tenant_id", "traceparent"})
#: Names a task cannot take: they are the flow tasks' types and the named-body type.
RESERVED_NAMES = TASK_TYPES | {NAMED_TYPE}
#: The attribute ``@registry.task`` sets on the function: its task name (``TaskClient.enqueue(fn)``).
NAME_ATTR = "plaita_task_name"
#: A retry waits its backoff times a random factor in [1, 1 + JITTER): retries of tasks that
#: failed together (a dependency down) do not all come back in the same millisecond.
JITTER = 0.25


@dataclass(frozen=True)
class TaskDef:
    """One registered task: its function and how it is retried and kept."""

    name: str
    fn: Callable[..., Any]
    #: Retries after the first attempt (0: a failure goes straight to the DLQ).
    retries: int = 3
    #: The first retry's delay; each next one doubles it, up to ``backoff_max_s``.
    backoff_s: float = 1.0
    backoff_max_s: float = 300.0
    #: Keep the return value (or the final error) this long for ``TaskClient.result``; None: none kept.
    result_ttl_s: float | None = None

    def retry_delay_s(self, attempt: int) -> float:
        """How long to wait before the attempt after ``attempt`` (1-based) failed."""
        base: float = min(self.backoff_max_s, self.backoff_s * 2.0 ** max(0, attempt - 1))
        return base * random.uniform(1.0, 1.0 + JITTER)


class TaskCall(NamedTuple):
    """What a body asks for: the task, its arguments, its id and which attempt this is."""

    name: str
    args: list[Any]
    kwargs: dict[str, Any]
    task_id: str
    attempt: int


def parse_call(body: dict[str, Any], message_id: str) -> TaskCall:
    """The call a named-task body makes; BadTaskError (to the DLQ) for a malformed one."""
    if body["type"] == NAMED_TYPE:
        name, args, kwargs = body.get("task"), body.get("args", []), body.get("kwargs", {})
        if not isinstance(name, str) or not name:
            raise BadTaskError(f"a 'task' body needs a task name in 'task' (got {short_repr(name)})")
        if not isinstance(args, list):
            raise BadTaskError(f"'args' must be a JSON array (got {short_repr(args)})")
        if not isinstance(kwargs, dict):
            raise BadTaskError(f"'kwargs' must be a JSON object (got {short_repr(kwargs)})")
    else:
        name, args = body["type"], []
        kwargs = {k: v for k, v in body.items() if k not in ENVELOPE_FIELDS}
    task_id = body.get("task_id")
    attempt = body.get("attempt", 1)
    if not isinstance(attempt, int) or isinstance(attempt, bool) or attempt < 1:
        raise BadTaskError(f"'attempt' must be a positive integer (got {short_repr(attempt)})")
    return TaskCall(name, args, kwargs, task_id if isinstance(task_id, str) and task_id else message_id, attempt)


class TaskRegistry:
    """Named tasks: ``tasks = TaskRegistry()``, then ``@tasks.task`` (or ``@tasks.task(name=...,
    retries=..., backoff_s=..., result_ttl_s=...)``) on module-level functions, sync or ``async``.
    The decorator returns the function itself, so it still pickles by its module path (``--pool
    process``) and can be called directly."""

    def __init__(self) -> None:
        self._tasks: dict[str, TaskDef] = {}

    @overload
    def task(self, fn: Callable[..., Any], /) -> Callable[..., Any]: ...

    @overload
    def task(
        self,
        *,
        name: str | None = None,
        retries: int = 3,
        backoff_s: float = 1.0,
        backoff_max_s: float = 300.0,
        result_ttl_s: float | None = None,
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]: ...

    def task(self, fn: Callable[..., Any] | None = None, /, **options: Any) -> Any:  # type: ignore[misc]
        if fn is not None:
            return self._register(fn)
        return lambda f: self._register(f, **options)

    def _register(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        retries: int = 3,
        backoff_s: float = 1.0,
        backoff_max_s: float = 300.0,
        result_ttl_s: float | None = None,
    ) -> Callable[..., Any]:
        task_name = name if name is not None else fn.__name__
        _check_definition(task_name, retries, backoff_s, backoff_max_s, result_ttl_s)
        if task_name in self._tasks:
            raise ConfigError(f"task {task_name!r} is registered twice")
        self._tasks[task_name] = TaskDef(task_name, fn, retries, backoff_s, backoff_max_s, result_ttl_s)
        setattr(fn, NAME_ATTR, task_name)
        return fn

    def add(self, definition: TaskDef) -> None:
        """Register ``definition`` (merging registries); ConfigError for a name taken."""
        if definition.name in self._tasks and self._tasks[definition.name] is not definition:
            raise ConfigError(f"task {definition.name!r} is registered twice")
        self._tasks[definition.name] = definition

    def get(self, name: str) -> TaskDef | None:
        return self._tasks.get(name)

    def names(self) -> list[str]:
        return sorted(self._tasks)

    def __iter__(self) -> Iterator[TaskDef]:
        return iter(self._tasks.values())

    def __len__(self) -> int:
        return len(self._tasks)


def _check_definition(
    name: str, retries: int, backoff_s: float, backoff_max_s: float, result_ttl_s: float | None
) -> None:
    """ConfigError for a task definition that cannot work."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"a task name must be a non-empty string (got {name!r})")
    if name in RESERVED_NAMES:
        raise ConfigError(f"{name!r} cannot name a task: it is a reserved body type ({sorted(RESERVED_NAMES)})")
    if not isinstance(retries, int) or retries < 0:
        raise ConfigError(f"task {name!r}: retries must be an integer >= 0 (got {retries!r})")
    if not (0 <= backoff_s <= backoff_max_s):
        raise ConfigError(f"task {name!r}: need 0 <= backoff_s <= backoff_max_s (got {backoff_s}, {backoff_max_s})")
    if result_ttl_s is not None and not result_ttl_s > 0:
        raise ConfigError(f"task {name!r}: result_ttl_s must be > 0 or None (got {result_ttl_s!r})")


def task_name_of(task: str | Callable[..., Any]) -> str:
    """The name ``task`` is enqueued under: a string as is, a registered function by its name."""
    if isinstance(task, str):
        return task
    name = getattr(task, NAME_ATTR, None)
    if not isinstance(name, str):
        raise ConfigError(f"{short_repr(task)} is not a registered task: decorate it with @registry.task")
    return name


def load_task_registry(module_name: str) -> TaskRegistry:
    """The tasks of ``module_name`` (``--tasks MODULE``): every ``TaskRegistry`` at its top level,
    merged. ConfigError if it cannot be imported or has none."""
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"--tasks {module_name!r}: cannot import it: {exc}") from None
    except Exception as exc:  # the module raised while importing: still a configuration error
        raise ConfigError(f"--tasks {module_name!r}: importing it raised {type(exc).__name__}: {exc}") from None
    found = [value for value in vars(module).values() if isinstance(value, TaskRegistry)]
    if not found:
        raise ConfigError(
            f"--tasks {module_name!r}: the module has no plaita.TaskRegistry at its top level "
            "(tasks = plaita.TaskRegistry(), then @tasks.task on each function)"
        )
    merged = TaskRegistry()
    for registry in found:
        for definition in registry:
            merged.add(definition)
    if not len(merged):
        raise ConfigError(f"--tasks {module_name!r}: its TaskRegistry has no task")
    return merged
