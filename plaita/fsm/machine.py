"""Builds the runtime lifecycle machine from ``TRANSITIONS``.

One owner thread fires triggers (a single writer needs no locking and keeps callbacks in order);
other threads only post requests.
The model is a small dedicated class so trigger names never collide with worker methods.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from transitions import EventData, Machine

from plaita.fsm.backoff import BackoffPolicy
from plaita.fsm.states import State
from plaita.fsm.table import TRANSITIONS

# transitions logs every callback at INFO and, with model_override=True, warns once per name it
# deliberately does not bind ("Skip binding of 'is_INIT'"); the worker logs transitions itself.
logging.getLogger("transitions").setLevel(logging.ERROR)

TransitionListener = Callable[[State, State, str], None]


class Lifecycle:
    """The FSM model: the current state, the backoff policy and when the state was entered.

    The trigger methods below are typed stubs; ``model_override=True`` makes ``transitions``
    replace exactly these with the real triggers (and mypy still sees their signatures).
    """

    state: State

    def __init__(
        self,
        *,
        backoff: BackoffPolicy | None = None,
        initial: State = State.INIT,
        listener: TransitionListener | None = None,
    ) -> None:
        self.backoff = backoff if backoff is not None else BackoffPolicy()
        self.entered_at_s = time.monotonic()
        #: How long the state before the current one lasted (for metrics).
        self.previous_state_duration_s = 0.0
        self.last_failure_persistent = False
        #: Every state entered so far (readiness: "starting" until consuming began once).
        self.visited: set[State] = {initial}
        self._listener = listener
        self.machine = build_machine(self, initial=initial)

    # -- callbacks named in TRANSITIONS and on the machine --------------------------------
    def schedule_backoff(self, event: EventData) -> None:
        """Arm the backoff delay; ``persistent=True`` skips the exponential ramp."""
        persistent = bool(event.kwargs.get("persistent", False))
        self.last_failure_persistent = persistent
        self.backoff.schedule(persistent=persistent)

    def backoff_due(self, event: EventData) -> bool:
        """Condition of ``backoff_elapsed``: the armed delay has passed."""
        return self.backoff.due()

    def _after_state_change(self, event: EventData) -> None:
        transition = event.transition
        if transition is None or transition.dest is None:
            return  # internal no-op (stopping twice): nothing changed
        now = time.monotonic()
        self.previous_state_duration_s = now - self.entered_at_s
        self.entered_at_s = now
        self.visited.add(State[transition.dest])
        if self._listener is not None:
            self._listener(State[transition.source], State[transition.dest], event.event.name)

    def seconds_in_state(self) -> float:
        """How long the current state has lasted, on the monotonic clock."""
        return time.monotonic() - self.entered_at_s

    # -- trigger stubs, replaced by transitions (model_override=True) ---------------------
    def trigger(self, trigger_name: str, *args: Any, **kwargs: Any) -> bool:
        raise NotImplementedError  # pragma: no cover - bound by transitions

    def may_trigger(self, trigger_name: str, *args: Any, **kwargs: Any) -> bool:
        raise NotImplementedError  # pragma: no cover - bound by transitions


def build_machine(model: Lifecycle, *, initial: State = State.INIT) -> Machine:
    """A plain ``Machine`` over ``model`` from the table; no auto ``to_<STATE>`` triggers."""
    return Machine(
        model=model,
        states=State,
        transitions=TRANSITIONS,
        initial=initial,
        auto_transitions=False,
        send_event=True,
        model_override=True,
        after_state_change="_after_state_change",
    )
