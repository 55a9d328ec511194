"""What an execution records of a failure and of each step run: the ``error`` field and the
history entries. Pure: no Redis, no clock (times are arguments)."""

from __future__ import annotations

import traceback
from typing import Any

#: Tracebacks are cut to their last characters (the innermost frames say the most).
TRACEBACK_CHARS = 4000


def error_doc(step: str | None, kind: str, message: str) -> dict[str, Any]:
    """An execution's ``error`` field for a failure that is not a step's exception."""
    return {"step": step, "type": kind, "message": message, "attempts": 0, "traceback": None}


def error_from_exception(step: str, exc: BaseException, attempts: int) -> dict[str, Any]:
    text = "".join(traceback.format_exception(exc))
    return {
        "step": step,
        "type": getattr(exc, "kind", None) or type(exc).__name__,
        "message": exception_text(exc)[:2000],
        "attempts": attempts,
        "traceback": text[-TRACEBACK_CHARS:],
    }


def exception_text(exc: BaseException) -> str:
    """``str(exc)``, or a placeholder when the step's exception cannot even say what it is: a
    describing error must not escape the runner (the task would be redelivered, not failed)."""
    try:
        return str(exc)
    except Exception:
        return f"<unprintable {type(exc).__name__}>"


def describe_exception(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exception_text(exc)}"[:500]


def history_entry(
    step: str, attempt: int, started_s: float, ended_s: float, outcome: str, error: str | None = None
) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "step": step,
        "attempt": attempt,
        "started_at": started_s,
        "ended_at": ended_s,
        "outcome": outcome,
    }
    if error is not None:
        entry["error"] = error
    return entry
