"""The worker's lifecycle states."""

from __future__ import annotations

import enum


class State(enum.Enum):
    """Where the worker is in its lifecycle. ``STOPPED`` is terminal."""

    INIT = "INIT"
    ENSURE_GROUP = "ENSURE_GROUP"
    RESUMING_OWN = "RESUMING_OWN"
    RECLAIMING = "RECLAIMING"
    ISOLATING = "ISOLATING"
    READING = "READING"
    BACKOFF = "BACKOFF"
    PAUSED = "PAUSED"
    STOPPING = "STOPPING"
    STOPPED = "STOPPED"


#: States from which nothing leaves.
TERMINAL_STATES = frozenset({State.STOPPED})

#: States in which the worker issues stream commands; a Redis failure there means BACKOFF.
ACTIVE_STATES = (State.ENSURE_GROUP, State.RESUMING_OWN, State.RECLAIMING, State.ISOLATING, State.READING)
