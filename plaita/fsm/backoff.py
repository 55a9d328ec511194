"""Exponential backoff with jitter, measured on the monotonic clock.

``time.monotonic`` is looked up at call time (not imported by name) so that freezegun,
which patches ``time.monotonic`` while frozen, controls every decision in tests.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

#: First delay after a transient failure, in seconds.
DEFAULT_BACKOFF_BASE_S = 0.1
#: Longest delay between retries of a transient failure; kept short so the first task after
#: Redis returns completes within about a second.
DEFAULT_BACKOFF_CAP_S = 1.0
#: Delay between retries of a persistent failure (auth, ACL, WRONGTYPE): no ramp, straight
#: to this (never shorter than the transient cap), so an operator's fix is picked up within
#: seconds without a busy loop.
DEFAULT_PERSISTENT_BACKOFF_S = 5.0
#: Fraction of the delay that jitter may remove: delay is uniform in [d·(1-j), d].
DEFAULT_JITTER = 0.5


@dataclass
class BackoffPolicy:
    """Computes and tracks the current backoff delay. Not thread-safe: the owner thread uses it."""

    base_s: float = DEFAULT_BACKOFF_BASE_S
    cap_s: float = DEFAULT_BACKOFF_CAP_S
    persistent_s: float = DEFAULT_PERSISTENT_BACKOFF_S
    jitter: float = DEFAULT_JITTER
    rng: random.Random = field(default_factory=random.Random)
    attempt: int = 0
    due_at_s: float | None = None
    last_delay_s: float = 0.0

    def __post_init__(self) -> None:
        if self.base_s <= 0 or self.cap_s < self.base_s or self.persistent_s <= 0:
            raise ValueError("backoff needs 0 < base_s <= cap_s and persistent_s > 0")
        if not 0.0 <= self.jitter <= 1.0:
            raise ValueError("jitter must be within [0, 1]")

    def nominal_delay_s(self, attempt: int, *, persistent: bool = False) -> float:
        """The delay before jitter for the given attempt number (0-based)."""
        if persistent:
            return max(self.persistent_s, self.cap_s)
        # Cap the exponent too: 2**attempt overflows floats after ~1000 failures.
        return min(self.cap_s, self.base_s * float(2 ** min(attempt, 62)))

    def schedule(self, *, persistent: bool = False) -> float:
        """Start a backoff: pick the jittered delay, arm the deadline, count the attempt."""
        nominal = self.nominal_delay_s(self.attempt, persistent=persistent)
        delay = nominal * (1.0 - self.jitter * self.rng.random())
        self.attempt += 1
        self.last_delay_s = delay
        self.due_at_s = time.monotonic() + delay
        return delay

    def remaining_s(self) -> float:
        """Seconds until the armed delay has passed (0 when due or not armed)."""
        if self.due_at_s is None:
            return 0.0
        return max(0.0, self.due_at_s - time.monotonic())

    def due(self) -> bool:
        """True once the armed delay has elapsed (or nothing is armed)."""
        return self.due_at_s is None or time.monotonic() >= self.due_at_s

    def reset(self) -> None:
        """Forget past failures: called after a successful read."""
        self.attempt = 0
        self.due_at_s = None
