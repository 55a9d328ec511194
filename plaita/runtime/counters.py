"""Per-process task counters: the shutdown summary, the status file and the metrics."""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass

from plaita.runtime.observer import Observers


@dataclass
class Counters:
    """How many tasks reached each outcome since the process started."""

    read: int = 0
    reclaimed: int = 0
    completed: int = 0
    failed: int = 0
    dead_lettered: int = 0
    bad_input: int = 0
    lease_conflicts: int = 0
    leases_lost: int = 0
    handed_back: int = 0
    #: Tasks left pending because a key they need is not what plaita wrote (wrong type, no TTL).
    bad_keys: int = 0


class CounterBook:
    """Thread-safe counters that also tell the observers."""

    def __init__(self, observers: Observers) -> None:
        self.counters = Counters()
        self._lock = threading.Lock()
        self._observers = observers

    def add(self, name: str, n: int = 1) -> None:
        if n:
            with self._lock:
                setattr(self.counters, name, getattr(self.counters, name) + n)
            self._observers.tasks_counted(name, n)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return asdict(self.counters)
