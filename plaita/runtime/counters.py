"""Per-process task counters: the shutdown summary, the status file and the metrics."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, fields

from plaita.runtime.observer import Observers


@dataclass(eq=False)
class Counters:
    """How many tasks reached each outcome since the process started.

    Any thread may read a counter; writes go through ``add`` (under the lock), which also
    tells the observers, so the metrics never disagree with the status file.
    """

    observers: Observers = field(repr=False)
    read: int = field(default=0, init=False)
    reclaimed: int = field(default=0, init=False)
    completed: int = field(default=0, init=False)
    failed: int = field(default=0, init=False)
    dead_lettered: int = field(default=0, init=False)
    bad_input: int = field(default=0, init=False)
    lease_conflicts: int = field(default=0, init=False)
    leases_lost: int = field(default=0, init=False)
    handed_back: int = field(default=0, init=False)
    #: Tasks left pending because a key they need is not what plaita wrote (wrong type, no TTL).
    bad_keys: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()

    def add(self, name: str, n: int = 1) -> None:
        if name not in COUNTER_NAMES:
            raise ValueError(f"no counter named {name!r}")  # a typo must not create a new attribute
        if n:
            with self._lock:
                setattr(self, name, getattr(self, name) + n)
            self.observers.tasks_counted(name, n)

    def snapshot(self) -> dict[str, int]:
        """Every counter by name, read at one instant."""
        with self._lock:
            return {name: getattr(self, name) for name in COUNTER_NAMES}


#: Every counter's name, in declaration order.
COUNTER_NAMES = tuple(f.name for f in fields(Counters) if f.name != "observers")
