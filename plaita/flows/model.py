"""The execution state document (``plaita:execution:{id}``) and the task bodies that drive it.

Pure: builds and reads plain dicts, so the store, the engine, the producer API and the CLI
agree on one shape.
"""

from __future__ import annotations

import traceback
from typing import Any

from plaita.flows.definition import Flow

#: Resume types of the original plaita (``resume_type`` in a resume body).
RESUME_TYPES = frozenset({"continue", "retry", "cancel", "timeout", "event"})
#: Terminal executions expire after this (default 7 days).
DEFAULT_RETENTION_S = 7 * 24 * 3600
#: A state document larger than this is refused (params at start; a step's output ends in error).
DEFAULT_MAX_STATE_BYTES = 512 * 1024
#: History entries kept per execution (the newest); ``steps_run`` keeps counting.
HISTORY_LIMIT = 200
#: Resume ids remembered per execution, so a redelivered resume is a no-op.
APPLIED_RESUMES_LIMIT = 100
#: Tracebacks are cut to their last characters (the innermost frames say the most).
TRACEBACK_CHARS = 4000


def new_execution(
    execution_id: str, flow: Flow, params: dict[str, Any], *, dedup_key: str | None, now_s: float
) -> dict[str, Any]:
    return {
        "execution_id": execution_id,
        "flow_id": flow.flow_id,
        "fingerprint": flow.fingerprint,
        "version": flow.version,
        # The versions this execution is at or newer than (older workers hand it back).
        "versions": flow.lineage(),
        "status": "running",
        "step_index": 0,
        "step": flow.steps[0].name,
        "attempt": 0,
        "params": params,
        "state": {},
        "results": {},
        "resume": None,
        "suspension": None,
        "history": [],
        "steps_run": 0,
        "applied_resumes": [],
        "error": None,
        "dedup_key": dedup_key,
        "created_at": now_s,
        "updated_at": now_s,
        "ended_at": None,
    }


def add_history(doc: dict[str, Any], entry: dict[str, Any]) -> None:
    history = doc.setdefault("history", [])
    history.append(entry)
    if len(history) > HISTORY_LIMIT:
        del history[: len(history) - HISTORY_LIMIT]
    doc["steps_run"] = int(doc.get("steps_run", 0)) + 1


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


def exception_text(exc: BaseException) -> str:
    """``str(exc)``, or a placeholder when the step's exception cannot even say what it is: a
    describing error must not escape the runner (the task would be redelivered, not failed)."""
    try:
        return str(exc)
    except Exception:
        return f"<unprintable {type(exc).__name__}>"


def describe_exception(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exception_text(exc)}"[:500]


def error_from_exception(step: str, exc: BaseException, attempts: int) -> dict[str, Any]:
    text = "".join(traceback.format_exception(exc))
    return {
        "step": step,
        "type": getattr(exc, "kind", None) or type(exc).__name__,
        "message": exception_text(exc)[:2000],
        "attempts": attempts,
        "traceback": text[-TRACEBACK_CHARS:],
    }


def error_doc(step: str | None, kind: str, message: str) -> dict[str, Any]:
    return {"step": step, "type": kind, "message": message, "attempts": 0, "traceback": None}


def make_too_large(doc: dict[str, Any], size: int, limit: int, step: str | None) -> str:
    """Turn ``doc`` into an ``error`` state small enough to write; returns the message."""
    message = f"state is {size} bytes after step {step!r}, over the {limit}-byte limit"
    error = error_doc(doc.get("step"), "StateTooLarge", message)
    doc.update(state={}, results={}, resume=None, error=error, status="error")
    return message


def stale_timeout(body: dict[str, Any], doc: dict[str, Any], resume_type: str) -> bool:
    """A timeout for a suspension that already ended (resumed, maybe suspended again)."""
    if resume_type != "timeout":
        return False
    suspension = doc.get("suspension")
    if doc.get("status") != "suspended" or not isinstance(suspension, dict):
        return True
    wanted = body.get("suspension")
    return wanted is not None and wanted != suspension.get("seq")


def apply_resume(doc: dict[str, Any], resume_type: str, data: Any, resume_id: str) -> None:
    """Mark a suspended execution resumed: the suspended step runs again with ``ctx.resume``."""
    doc["status"] = "running"
    doc["resume"] = {"type": resume_type, "data": data}
    doc["suspension"] = None
    applied = [*doc.get("applied_resumes", []), resume_id]
    doc["applied_resumes"] = applied[-APPLIED_RESUMES_LIMIT:]


def start_body(
    flow_id: str,
    params: dict[str, Any],
    execution_id: str,
    *,
    dedup_key: str | None = None,
    version: str | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"type": "start", "flow_id": flow_id, "params": params, "execution_id": execution_id}
    if dedup_key is not None:
        body["dedup_key"] = dedup_key
    if version is not None:
        body["version"] = version
    return body


def resume_body(
    execution_id: str,
    resume_type: str,
    *,
    flow_id: str | None = None,
    data: Any = None,
    resume_id: str | None = None,
    suspension: int | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"type": "resume", "execution_id": execution_id, "resume_type": resume_type}
    if flow_id is not None:
        body["flow_id"] = flow_id
    if data is not None:
        body["data"] = data
    if resume_id is not None:
        body["resume_id"] = resume_id
    if suspension is not None:
        body["suspension"] = suspension
    return body
