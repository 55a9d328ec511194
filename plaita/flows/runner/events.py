"""Events: small named values a running step publishes (``ctx.publish``, ``ctx.set_progress``)
that producers read at once (``FlowClient.events``, ``plaita executions show``), without waiting
for the step's checkpoint.

A publish is one fenced script call (``plaita.store.executions.events``): written at once, refused once the
worker lost the execution's lease. The last value per name wins. Values are strict JSON, each at
most ``MAX_EVENT_BYTES`` encoded, at most ``MAX_EVENTS`` names per execution, so a step in a loop
cannot grow the hash without bound. Not part of the checkpoint: a step that fails after
publishing leaves what it published.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from plaita.clock import wall_s
from plaita.errors import LeaseLostError
from plaita.flows.io import EventWriter
from plaita.flows.model.validate import dumps, json_problem
from plaita.tasks import Task

#: Most distinct names one execution publishes (a later new name is refused; an existing one
#: may always be published again).
MAX_EVENTS = 100
#: Largest value (its strict JSON encoding, in bytes).
MAX_EVENT_BYTES = 64 * 1024
#: Longest name, in characters.
MAX_EVENT_NAME_CHARS = 200

#: What a step's context calls: (name, value) -> None, or raises.
Publisher = Callable[[str, Any], None]


def record_json(name: Any, value: Any, step: str, now_s: float) -> str:
    """The stored record of one publish; ValueError for a bad name or value."""
    if not isinstance(name, str) or not name or len(name) > MAX_EVENT_NAME_CHARS:
        raise ValueError(f"an event name must be a non-empty string of at most {MAX_EVENT_NAME_CHARS} characters")
    problem = json_problem(value)
    if problem is not None:
        raise ValueError(f"event {name!r}: the value is not strict JSON ({problem})")
    size = len(dumps(value).encode("utf-8"))
    if size > MAX_EVENT_BYTES:
        raise ValueError(f"event {name!r}: the value is {size} bytes, over the {MAX_EVENT_BYTES}-byte limit")
    return dumps({"value": value, "at": now_s, "step": step})


class _Publish:
    """What ``ctx.publish`` of a step calls (``publisher``): one object per step, built for every
    step whether it publishes or not, so a slotted instance rather than a closure (no cells)."""

    __slots__ = ("_clock", "_step", "_store", "_task")

    def __init__(self, store: EventWriter, task: Task, step: str, clock: Callable[[], float]) -> None:
        self._store, self._task, self._step, self._clock = store, task, step, clock

    def __call__(self, name: str, value: Any) -> None:
        store, task = self._store, self._task
        text = record_json(name, value, self._step, self._clock())
        code = store.publish_event(task.execution_id, task.fencing_token, name, text, MAX_EVENTS)
        if code == 0:
            raise LeaseLostError(f"publish of event {name!r} refused: execution {task.execution_id} has a newer lease")
        if code == -1:
            raise ValueError(f"event {name!r}: execution {task.execution_id} already has {MAX_EVENTS} named events")
        if code == -2:
            key = store.events_key(task.execution_id)
            raise ValueError(f"event {name!r}: {key} holds another type than a hash")


def publisher(store: EventWriter, task: Task, step: str, clock: Callable[[], float] = wall_s) -> Publisher:
    """What ``ctx.publish`` of ``step`` calls: one fenced write under the task's lease."""
    return _Publish(store, task, step, clock)
