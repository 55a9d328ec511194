"""An outage as one object: since when, how many retries, the last classified failure.

The owner loop records every failure here and ends the outage when Redis answers again;
logging and readiness both read it, so they can never disagree about what is wrong.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from plaita.fsm import ErrorKind
from plaita.store.errors import cause, classify

#: Longest error text kept (status file, registry entry, readiness reason).
ERROR_TEXT_MAX = 300


@dataclass(frozen=True)
class Failure:
    """One classified failure of a Redis call (or of the loop itself)."""

    kind: ErrorKind
    source: str
    #: ``TypeName: message``, truncated.
    text: str
    #: ``auth``, ``acl`` or ``""`` (see ``plaita.fsm.cause``).
    cause: str

    @classmethod
    def of(cls, exc: BaseException, source: str) -> Failure:
        return cls(classify(exc), source, f"{type(exc).__name__}: {exc}"[:ERROR_TEXT_MAX], cause(exc))


class Outage:
    """Not thread-safe for writes: only the owner thread records and ends outages."""

    def __init__(self) -> None:
        self.since_s: float | None = None
        self.retries = 0
        self.last: Failure | None = None

    @property
    def active(self) -> bool:
        return self.since_s is not None

    def record(self, exc: BaseException, source: str) -> tuple[Failure, bool]:
        """Note a failure; returns it and whether it began a new outage."""
        failure = Failure.of(exc, source)
        first = self.since_s is None
        if first:
            self.since_s, self.retries = time.monotonic(), 0
        else:
            self.retries += 1
        self.last = failure
        return failure, first

    def end(self) -> tuple[float, int] | None:
        """Redis answered: (seconds it lasted, retries) if an outage was active, else None."""
        if self.since_s is None:
            return None
        lasted = (time.monotonic() - self.since_s, self.retries)
        self.since_s, self.retries, self.last = None, 0, None
        return lasted

    def reason(self) -> str:
        """Why the worker is not ready (for /readyz and the status)."""
        last = self.last
        if last is None:
            return "backoff"
        if last.cause:
            return f"{last.cause}: {last.text}"
        return f"redis {last.kind.value} failure: {last.text}"
