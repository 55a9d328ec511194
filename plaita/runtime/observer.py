"""What the worker tells the world: a small observer interface that ``plaita.ops`` implements.

The runtime never imports ops. The CLI builds an ``Operations`` for a worker and attaches it;
tests attach recorders. Every notification is fanned out by ``Observers``, which guards each
call: a bug in an observer is logged and must never stop the consume loop.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Protocol

from plaita.fsm import ErrorKind, State
from plaita.store.streams.entries import DeadLetter

logger = logging.getLogger(__name__)


class WorkerObserver(Protocol):
    """Implemented by ops (registry, control, metrics, health, sd_notify, status file)."""

    def worker_started(self) -> None:
        """The owner loop is about to fire ``start`` (threads of the observer may start now)."""

    def worker_stopped(self) -> None:
        """The owner loop ended; called once on the way out. Must be quick and bounded."""

    def state_changed(self, source: State, dest: State, previous_duration_s: float) -> None:
        """A real transition happened (no-op transitions are not reported)."""

    def tasks_counted(self, outcome: str, n: int) -> None:
        """``n`` more tasks reached ``outcome`` (a ``Counters`` field name)."""

    def tasks_finished(self, durations_s: list[float]) -> None:
        """Handler durations of a chunk of finished tasks."""

    def redis_failed(self, kind: ErrorKind, error_name: str) -> None:
        """A Redis call failed and the worker goes to BACKOFF."""

    def dead_lettered(self, letters: list[DeadLetter]) -> None:
        """These tasks are in the DLQ now (called on the settler thread once the write succeeded;
        optional). Must only queue work: it runs between two settle batches."""


class ExecutionObserver(Protocol):
    """What a flow runner reports (optional: an observer without these methods is skipped)."""

    def execution_event(self, flow_id: str, event: str) -> None:
        """An execution was ``started`` here, or a checkpoint left it ``suspended``,
        ``completed``, ``failed`` (status error) or ``cancelled``."""

    def step_finished(self, flow_id: str, step: str, outcome: str, duration_s: float) -> None:
        """One run of a step ended: ``ok``, ``suspended`` or ``failed`` (it raised)."""

    def execution_failed(self, flow_id: str, execution_id: str, error: dict[str, Any] | None) -> None:
        """A checkpoint ended the execution in ``error`` (``error``: its step, type, message...)."""

    def run_began(self, flow_id: str) -> None:
        """This worker started advancing an execution (a task that was not a no-op)."""

    def run_ended(self, flow_id: str) -> None:
        """This worker stopped advancing it (checkpointed, suspended, failed or lost the lease)."""


#: Notifications an observer may leave out (older observers, test recorders).
OPTIONAL = frozenset(
    {"dead_lettered", "execution_event", "execution_failed", "step_finished", "run_began", "run_ended"}
)


class Observers:
    """Fans every notification out to the attached observers, each call guarded."""

    def __init__(self) -> None:
        self._observers: list[WorkerObserver] = []
        self._runs_lock = threading.Lock()
        self._runs = 0

    def attach(self, observer: WorkerObserver) -> None:
        self._observers.append(observer)

    def _each(self, name: str, *args: object) -> None:
        for observer in self._observers:
            if name in OPTIONAL and not hasattr(observer, name):
                continue
            try:
                getattr(observer, name)(*args)
            except Exception:  # an observer bug must never stop consuming
                logger.exception("worker observer %s.%s failed", type(observer).__name__, name)

    def worker_started(self) -> None:
        self._each("worker_started")

    def worker_stopped(self) -> None:
        self._each("worker_stopped")

    def state_changed(self, source: State, dest: State, previous_duration_s: float) -> None:
        self._each("state_changed", source, dest, previous_duration_s)

    def tasks_counted(self, outcome: str, n: int) -> None:
        self._each("tasks_counted", outcome, n)

    def tasks_finished(self, durations_s: list[float]) -> None:
        self._each("tasks_finished", durations_s)

    def redis_failed(self, kind: ErrorKind, error_name: str) -> None:
        self._each("redis_failed", kind, error_name)

    def dead_lettered(self, letters: list[DeadLetter]) -> None:
        self._each("dead_lettered", letters)

    # -- executions (the flow runner calls these; it is an ``ExecutionObserver``) --------------
    @property
    def executions_in_flight(self) -> int:
        """Executions this worker is advancing now (for its status and registry entry)."""
        with self._runs_lock:
            return self._runs

    def execution_event(self, flow_id: str, event: str) -> None:
        self._each("execution_event", flow_id, event)

    def execution_failed(self, flow_id: str, execution_id: str, error: dict[str, Any] | None) -> None:
        self._each("execution_failed", flow_id, execution_id, error)

    def step_finished(self, flow_id: str, step: str, outcome: str, duration_s: float) -> None:
        self._each("step_finished", flow_id, step, outcome, duration_s)

    def run_began(self, flow_id: str) -> None:
        with self._runs_lock:
            self._runs += 1
        self._each("run_began", flow_id)

    def run_ended(self, flow_id: str) -> None:
        with self._runs_lock:
            self._runs -= 1
        self._each("run_ended", flow_id)
