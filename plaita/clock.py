"""The wall clock plaita's durable times are read from: one seam a test can move.

Every time plaita stores, or compares with a stored time, is read through ``wall_s()``: a
sleep's or a suspension's deadline, an execution's deadline, the wait before a retry, a
schedule's ticks and its records' age, the timestamps of a checkpoint. It is ``time.time``
unless a test installs another clock (``plaita.testing.TestClock``, which only ever moves
ahead of the real one); nothing in plaita itself sets it.

What measures how long a live process may stay silent (leases, the keeper lease, flow slots,
heartbeats, intervals between passes) runs on Redis's and the machine's own clocks instead: a
test clock that jumps three days ahead must not make a worker that is running right now look
dead.
"""

from __future__ import annotations

import time
from collections.abc import Callable

#: The clock ``wall_s`` reads: epoch seconds as a float.
_clock: Callable[[], float] = time.time


def wall_s() -> float:
    """Now, in epoch seconds, on the installed clock (``time.time`` by default)."""
    return _clock()


def install_clock(clock: Callable[[], float] | None) -> Callable[[], float]:
    """Make ``clock`` the one ``wall_s`` reads (None: ``time.time`` again); returns the one it
    replaces, so a caller can put it back. For tests: a process has one wall clock."""
    global _clock
    previous, _clock = _clock, (clock if clock is not None else time.time)
    return previous
