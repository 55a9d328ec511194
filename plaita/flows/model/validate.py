"""Strict JSON and bounded values for everything an execution stores. Pure: no Redis.

Python's json writes NaN and Infinity by default, which strict parsers (and ``jq``) reject, and a
NaN deadline never comes due: every execution document, result, param and resume datum is
written with ``allow_nan=False``, and a value that cannot be is refused where it comes from.
"""

from __future__ import annotations

import copy
import json
import math
from typing import Any

import msgspec

from plaita.errors import BadTaskError, PlaitaError
from plaita.store.executions.staged import MAX_SECONDS


class StepOutputError(PlaitaError):
    """What a step produced cannot be checkpointed (a result or state that is not strict JSON, a
    staged write Redis would refuse). A failed attempt of the step: its retry policy applies, then
    the execution ends in ``error`` with ``kind`` as the error type. Nothing of it was written."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


#: One encoder for every document (``json.dumps`` with options builds a new one per call; a
#: checkpoint encodes once per step). Stateless between calls, so shared by every thread.
_STRICT = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def dumps(value: Any) -> str:
    """Strict, compact JSON (ValueError for NaN/Infinity, TypeError for what is not JSON)."""
    return _STRICT.encode(value)


#: The fast path of ``dumps_document``: msgspec's C encoder and decoder (already what reads task
#: bodies, ``plaita.tasks``).
_FAST_ENCODER = msgspec.json.Encoder()
_FAST_DECODER = msgspec.json.Decoder()


def dumps_document(doc: dict[str, Any]) -> str:
    """``dumps(doc)`` for an execution document, about three times quicker (every checkpoint
    encodes one). msgspec encodes it; its output is read back and must equal ``doc``, else
    ``dumps`` decides: msgspec writes NaN as null and accepts what ``json`` refuses (sets,
    datetimes, bytes, dataclasses...), and each of those reads back as something else; so
    exactly the documents ``dumps`` accepts are written, and a refused one raises what
    ``dumps`` raises. The text may differ from ``dumps``'s only in how a float's exponent is
    spelt (``1e100``, not ``1e+100``): the same JSON value for every reader, old workers too."""
    try:
        data = _FAST_ENCODER.encode(doc)
        same = _FAST_DECODER.decode(data) == doc
    except Exception:  # what msgspec refuses (a lone surrogate, a key type, ...): json decides
        same = False
    return data.decode("utf-8") if same else dumps(doc)


def json_problem(value: Any) -> str | None:
    """Why ``value`` is not strict JSON, or None when it is."""
    try:
        dumps(value)
    except (TypeError, ValueError, RecursionError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def require_json(value: Any, what: str) -> None:
    """ValueError naming ``what`` (and its first bad top-level key) unless it is strict JSON."""
    problem = json_problem(value)
    if problem is None:
        return
    if isinstance(value, dict):
        for key, item in value.items():
            inner = json_problem(item)
            if inner is not None:
                raise ValueError(f"{what}[{key!r}] is not strict JSON ({type(item).__name__}; {inner})")
    raise ValueError(f"{what} is not strict JSON ({type(value).__name__}; {problem})")


def check_timeout_s(timeout_s: float | None) -> float | None:
    """A suspension's timeout: None (wait forever) or a finite number of seconds in [0, 10 years]."""
    if timeout_s is None:
        return None
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float):
        raise ValueError(f"timeout_s must be a number of seconds or None, got {type(timeout_s).__name__}")
    if not math.isfinite(timeout_s) or not 0 <= timeout_s <= MAX_SECONDS:
        raise ValueError(
            f"timeout_s must be between 0 and {MAX_SECONDS} s (10 years), got {timeout_s!r}; "
            "use None to wait without a timeout"
        )
    return float(timeout_s)


def check_deadline_s(deadline_s: float) -> float:
    """A whole-execution deadline, in seconds from now: finite, above 0, at most 10 years."""
    if isinstance(deadline_s, bool) or not isinstance(deadline_s, int | float):
        raise ValueError(f"deadline_s must be a number of seconds, got {type(deadline_s).__name__}")
    if not math.isfinite(deadline_s) or not 0 < deadline_s <= MAX_SECONDS:
        raise ValueError(f"deadline_s must be above 0 and at most {MAX_SECONDS} s (10 years), got {deadline_s!r}")
    return float(deadline_s)


def epoch_or_none(value: Any) -> float | None:
    """``value`` as finite epoch seconds, or None (absent, or not a finite number)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def task_deadline(body: dict[str, Any]) -> float | None:
    """A start body's ``deadline_at`` (epoch seconds; absent in older bodies: None); BadTaskError
    (the task goes to the DLQ) when it is there and not a finite number."""
    raw = body.get("deadline_at")
    deadline_at = epoch_or_none(raw)
    if raw is not None and deadline_at is None:
        raise BadTaskError(f"start 'deadline_at' must be a finite epoch time in seconds, got {raw!r}")
    return deadline_at


def output_error(doc: dict[str, Any], step: str | None) -> StepOutputError:
    """The error for a step output ``doc`` cannot be encoded: names the bad value's key."""
    result = (doc.get("results") or {}).get(step) if step is not None else None
    for value, what in ((result, "its result"), (doc.get("state"), "ctx.state")):
        try:
            require_json(value, what)
        except ValueError as exc:
            return StepOutputError("NotSerializable", f"step {step!r} cannot be checkpointed: {exc}")
    return StepOutputError("NotSerializable", f"step {step!r} left a document that is not JSON: {json_problem(doc)}")


def require_task_json(value: Any, what: str) -> None:
    """BadTaskError (the task goes to the DLQ) unless a task's ``what`` is strict JSON."""
    problem = json_problem(value)
    if problem is not None:
        raise BadTaskError(f"{what} is not strict JSON (NaN and Infinity are not JSON): {problem}")


#: Longest wait name (``ctx.suspend(wait_for=...)``), in characters.
MAX_WAIT_NAME_CHARS = 200


def check_wait_name(wait_for: Any, what: str = "wait_for") -> str | None:
    """``wait_for`` itself (None or a non-empty string of at most 200 characters); ValueError otherwise."""
    if wait_for is None:
        return None
    if not isinstance(wait_for, str) or not wait_for or len(wait_for) > MAX_WAIT_NAME_CHARS:
        raise ValueError(f"{what} must be a non-empty string of at most {MAX_WAIT_NAME_CHARS} characters")
    return wait_for


#: What ``copy.deepcopy`` returns as it is (immutable): a state's leaves, almost always.
_ATOMS = frozenset((str, int, float, bool, type(None)))


def copied_state(state: dict[str, Any]) -> dict[str, Any]:
    """``copy.deepcopy(state)``, the same copy, several times quicker for what a state holds
    (every step's context gets one): plain dicts and lists are copied here, leaves that
    ``deepcopy`` keeps as they are stay, anything else goes to ``deepcopy`` with the same memo,
    so a value found twice in ``state`` is one copy found twice, as with ``deepcopy``."""
    return _copied(state, {})  # type: ignore[no-any-return]


def _copied(value: Any, memo: dict[int, Any]) -> Any:
    """A copy of ``value``, a dict or a list, or what ``deepcopy`` makes of anything else (the
    leaves are tested at the caller: no call per leaf)."""
    kind = type(value)
    if kind is not dict and kind is not list:
        return copy.deepcopy(value, memo)
    done = memo.get(id(value))
    if done is not None:
        return done
    atoms = _ATOMS
    if kind is list:
        items: list[Any] = []
        memo[id(value)] = items
        items.extend([v if type(v) in atoms else _copied(v, memo) for v in value])
        return items
    mapping: dict[Any, Any] = {}
    memo[id(value)] = mapping
    for k, v in value.items():
        mapping[k if type(k) in atoms else copy.deepcopy(k, memo)] = v if type(v) in atoms else _copied(v, memo)
    return mapping
