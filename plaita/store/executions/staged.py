"""Staged writes: the values a step queues to commit with its checkpoint, checked before any write.

Redis does not roll back a script whose later command fails, so the checkpoint script must
never run a command that can fail once it has written. Everything known in Python is checked
here (TTL and increment bounds, and what earlier writes of the same checkpoint leave in a
key); what only Redis knows (a key's current type and value) is reduced to one requirement
per key that the script checks before its first write.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from plaita.errors import PlaitaError

#: Staged write operations a step may queue.
STAGE_OPS = frozenset({"set", "incrby", "rpush"})
#: Redis integers (INCRBY's operand and result) are signed 64-bit.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
#: Longest TTL a staged write (and a suspension) may ask for: ten years. Redis accepts far more
#: (until the expiry time in ms overflows 64 bits), but a larger value is a bug, not an intent.
MAX_SECONDS = 10 * 365 * 24 * 3600
#: What Redis parses as an integer for INCRBY (``string2ll``): no sign but '-', no leading zero.
_REDIS_INT = re.compile(r"-?[1-9][0-9]*|0")


class StagedWriteRefused(PlaitaError):
    """A staged write that Redis would refuse (a wrong-typed key, an integer overflow, a bad
    TTL): nothing of the checkpoint was written. The step's own fault, never a Redis failure."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"staged write to {key!r} refused: {reason}")
        self.key = key
        self.reason = reason


class ExecutionKeyError(PlaitaError):
    """An execution bookkeeping key (state, status index, deadlines, dedup) holds something
    plaita never writes there: the checkpoint or create wrote nothing. Not a Redis failure."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"execution key {key!r} {reason}: nothing was written (fix or delete the key)")
        self.key = key
        self.reason = reason


@dataclass(frozen=True)
class Staged:
    """One write a step queued to commit with its checkpoint."""

    op: str
    key: str
    value: str
    ttl_s: int = 0


def whole_number(value: object, what: str) -> int:
    """``value`` as an int if it is a whole, finite number (not a bool); else ValueError."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{what} must be a whole number, got {type(value).__name__} {value!r}")
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        raise ValueError(f"{what} must be a whole number, got {value!r}")
    return int(value)


def check_ttl_s(ttl_s: object) -> int:
    ttl = whole_number(ttl_s, "ttl_s")
    if not 0 <= ttl <= MAX_SECONDS:
        raise ValueError(f"ttl_s must be between 0 (no expiry) and {MAX_SECONDS} s (10 years), got {ttl}")
    return ttl


def check_amount(amount: object) -> int:
    value = whole_number(amount, "the increment")
    if not INT64_MIN <= value <= INT64_MAX:
        raise ValueError(f"the increment {value} is outside Redis's signed 64-bit range")
    return value


class _Key:
    """What the staged writes so far leave in one key, and what they need it to hold now."""

    def __init__(self) -> None:
        self.kind = "fresh"  # fresh | chain (INCRBYs on the current value) | list | text
        self.text = ""
        self.total = self.low = self.high = 0  # the INCRBY chain's running sum and its extremes
        self.need = ""  # '' (anything: the first write is a SET) | 'list' | 'int'

    def apply(self, op: str, value: str) -> str | None:
        """Record one write; the reason Redis would refuse it, if it would."""
        if op == "set":
            self.kind, self.text = "text", value
        elif op == "rpush":
            if self.kind in ("chain", "text"):
                return "RPUSH on a key an earlier staged write of this step made a string"
            self.need = self.need or ("list" if self.kind == "fresh" else "")
            self.kind = "list"
        else:
            return self._incr(int(value))
        return None

    def _incr(self, amount: int) -> str | None:
        if self.kind == "list":
            return "INCRBY on a key an earlier staged write of this step made a list"
        if self.kind == "text":
            if not _REDIS_INT.fullmatch(self.text) or not INT64_MIN <= int(self.text) <= INT64_MAX:
                return f"INCRBY on {self.text[:40]!r} (staged earlier in this step), which is not an integer"
            result = int(self.text) + amount
            if not INT64_MIN <= result <= INT64_MAX:
                return f"INCRBY {amount} on {self.text} overflows signed 64 bits"
            self.text = str(result)
            return None
        if self.kind == "fresh":
            self.kind, self.need = "chain", "int"
        self.total += amount
        self.low, self.high = min(self.low, self.total), max(self.high, self.total)
        return None

    def requirement(self) -> str:
        """The check the script makes on the key's current value before its first write."""
        if self.need != "int":
            return self.need
        lowest, highest = INT64_MIN - self.low, INT64_MAX - self.high
        return f"int:{lowest}:{highest}"


def plan(staged: Sequence[Staged]) -> list[str]:
    """The checkpoint script's arguments for ``staged``: per write op, value, ttl_s and the
    requirement on the key's current value (given with the key's first write only).

    StagedWriteRefused for a write Redis would refuse whatever the key holds now.
    """
    keys: dict[str, _Key] = {}
    first: dict[str, int] = {}
    for i, s in enumerate(staged):
        if s.op not in STAGE_OPS:
            raise StagedWriteRefused(s.key, f"unknown operation {s.op!r}")
        _check_value(s)
        state = keys.setdefault(s.key, _Key())
        first.setdefault(s.key, i)
        reason = state.apply(s.op, s.value)
        if reason is not None:
            raise StagedWriteRefused(s.key, reason)
    args: list[str] = []
    for i, s in enumerate(staged):
        need = keys[s.key].requirement() if first[s.key] == i else ""
        if need.startswith("int:") and int(need.split(":")[1]) > int(need.split(":")[2]):
            raise StagedWriteRefused(s.key, "its staged increments overflow signed 64 bits whatever it holds")
        args += [s.op, s.value, str(int(s.ttl_s)), need]  # "5", never "5.0": EXPIRE takes the string as sent
    return args


def _check_value(s: Staged) -> None:
    try:
        check_ttl_s(s.ttl_s)
        if s.op == "incrby":
            if not _REDIS_INT.fullmatch(s.value):
                raise ValueError(f"the increment {s.value[:40]!r} is not an integer")
            check_amount(int(s.value))
    except ValueError as exc:
        raise StagedWriteRefused(s.key, str(exc)) from None
