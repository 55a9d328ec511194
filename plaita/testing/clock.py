"""A wall clock a test moves ahead: a 3-day ``ctx.sleep`` passes in milliseconds.

``TestClock`` runs with the real clock plus an offset that only grows (``advance``), and is
installed as the one clock plaita's durable times are read from (``plaita.clock``): the
runner's checkpoints, sleeps and suspension deadlines, execution deadlines, the pause before a
retry, and the keeper's timeouts, wakes and schedule ticks all read it, and everything they
store in Redis is on it. Leases and other liveness timers stay on the real clocks, so moving
it never makes a running worker look dead. Redis itself is not touched: no key's TTL moves.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from types import TracebackType

from plaita.clock import install_clock


class TestClock:
    """Real time plus an offset that ``advance`` grows; a callable returning epoch seconds.

    ``install()`` makes it plaita's wall clock (``with TestClock() as clock:`` does it for the
    block); ``uninstall()`` puts the previous one back."""

    __test__ = False  # a helper, not a test class pytest should collect

    def __init__(self) -> None:
        self._offset_s = 0.0
        self._lock = threading.Lock()
        self._previous: Callable[[], float] | None = None

    def __call__(self) -> float:
        return time.time() + self._offset_s

    @property
    def offset_s(self) -> float:
        """How far ahead of the real clock this one is, in seconds."""
        return self._offset_s

    def advance(self, seconds: float) -> float:
        """Move ahead by ``seconds`` (finite, >= 0: a clock plaita reads never goes back);
        returns the new time."""
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not math.isfinite(seconds):
            raise ValueError(f"advance needs a finite number of seconds, got {seconds!r}")
        if seconds < 0:
            raise ValueError(f"a test clock only moves ahead (advance({seconds!r}))")
        with self._lock:
            self._offset_s += float(seconds)
        return self()

    def advance_to(self, epoch_s: float) -> float:
        """Move ahead to ``epoch_s`` (a time already past leaves the clock where it is)."""
        return self.advance(max(0.0, float(epoch_s) - self()))

    def install(self) -> TestClock:
        if self._previous is None:
            self._previous = install_clock(self)
        return self

    def uninstall(self) -> None:
        if self._previous is not None:
            install_clock(self._previous)
            self._previous = None

    def __enter__(self) -> TestClock:
        return self.install()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.uninstall()
