"""Addressed resumes: a wait names what it waits for, a resume names the wait it is for, and a
resume that arrives before its wait is kept in the execution until that wait runs.

``ctx.suspend(wait_for="payment")`` suspends for resumes addressed to ``payment`` only
(``FlowClient.resume(id, data=…, wait_for="payment")``). A resume addressed to a wait the
execution is not in now (it runs, sleeps, or waits for something else) is *parked*: kept in the
execution's document (``inbox``), its resume id recorded as received (a repeat is a no-op), until
a wait for its name suspends; that wait then takes the oldest one at once, without suspending.
Without this, an early webhook was consumed by whatever wait came first and the wait it was for
waited out its timeout.

Bounded: at most ``MAX_PARKED`` parked resumes per execution (one more goes to the DLQ with the
reason), each kept ``PARKED_TTL_S`` at most (an older one is dropped, with a warning, when the
inbox is next touched); those left when the execution ends are logged. An unaddressed resume
keeps its old meaning: it resumes whatever plain wait the execution is in.

Messages use this door as it is: ``FlowClient.send(id, topic, data)`` is an event addressed to
the wait ``topic``, and ``ctx.recv(topic)`` a wait for it, so kept messages queue per topic,
oldest first (``take``), within the same bound.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from plaita.errors import BadTaskError
from plaita.flows.model.execution import APPLIED_RESUMES_LIMIT, Execution

logger = logging.getLogger("plaita.flows.runner.engine")

#: Parked resumes one execution keeps at most; one more is refused (to the DLQ, with why).
MAX_PARKED = 32
#: How long a parked resume waits for its wait, at most (7 days, as a cancel flag).
PARKED_TTL_S = 7 * 86400.0


def accepts(execution: Execution, wait_for: str | None) -> bool:
    """Whether the wait ``execution`` is suspended in takes a resume addressed to ``wait_for``
    (None: unaddressed, which any plain wait takes, as before waits had names)."""
    suspension = execution.suspension or {}
    if execution.status != "suspended" or suspension.get("kind") == "sleep":
        return False
    return wait_for is None or suspension.get("wait_for") == wait_for


def park(execution: Execution, rtype: str, data: Any, resume_id: str, wait_for: str, now_s: float) -> Execution:
    """``execution`` keeping the resume for a later wait for ``wait_for``; BadTaskError when it
    keeps ``MAX_PARKED`` already."""
    kept = _fresh(execution, now_s)
    if len(kept) >= MAX_PARKED:
        raise BadTaskError(
            f"resume {resume_id} for wait {wait_for!r}: execution {execution.execution_id} already keeps "
            f"{MAX_PARKED} resumes no wait has taken (is a wait for {wait_for!r} ever reached?)"
        )
    entry = {"wait_for": wait_for, "type": rtype, "data": data, "id": resume_id, "at": now_s}
    logger.info(
        "execution %s: resume %s for wait %r kept until that wait runs (it is %s)",
        execution.execution_id,
        resume_id,
        wait_for,
        _where(execution),
    )
    applied = [*execution.applied_resumes, resume_id][-APPLIED_RESUMES_LIMIT:]
    return replace(execution, inbox=[*kept, entry], applied_resumes=applied)


def take(execution: Execution, wait_for: str | None, now_s: float) -> Execution | None:
    """``execution`` (just suspended in a wait for ``wait_for``) resumed by the oldest resume
    kept for that wait, or None when none is kept."""
    if wait_for is None or not execution.inbox:
        return None
    kept = _fresh(execution, now_s)
    for i, entry in enumerate(kept):
        if entry.get("wait_for") == wait_for:
            rest = kept[:i] + kept[i + 1 :]
            resumed = execution.resumed(str(entry.get("type")), entry.get("data"), str(entry.get("id")), now_s)
            return replace(resumed, inbox=rest)
    return None


def left_over(execution: Execution) -> None:
    """Log the resumes an ended execution kept that no wait took (they can never match now)."""
    if execution.terminal and execution.inbox:
        ids = ", ".join(f"{e.get('id')} ({e.get('wait_for')})" for e in execution.inbox)
        logger.warning(
            "execution %s ended %s; no wait took its resumes %s", execution.execution_id, execution.status, ids
        )


def _fresh(execution: Execution, now_s: float) -> list[dict[str, Any]]:
    kept = [e for e in execution.inbox if now_s - float(e.get("at") or 0.0) <= PARKED_TTL_S]
    if len(kept) != len(execution.inbox):
        old = [str(e.get("id")) for e in execution.inbox if e not in kept]
        logger.warning(
            "execution %s: resumes %s dropped: kept over %d s and no wait took them",
            execution.execution_id,
            ", ".join(old),
            int(PARKED_TTL_S),
        )
    return kept


def _where(execution: Execution) -> str:
    suspension = execution.suspension or {}
    if execution.status != "suspended":
        return execution.status
    if suspension.get("kind") == "sleep":
        return f"sleeping after {suspension.get('step')}"
    wanted = suspension.get("wait_for")
    return f"waiting in {suspension.get('step')} for " + (repr(wanted) if wanted else "an unaddressed resume")
