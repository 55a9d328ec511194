"""Flows of the cancel tests (``tests/flows/test_cancel_lands.py``), for harnesses and worker
processes (``--flows tests.flows.cancel_flows``). A step holds in place until the test sets its
release key (bounded: ``MAX_WAIT_S``), so a cancel surely arrives while it runs. Ledgers as in
``tests.flows.flowdefs``: every run counts directly, and once more staged (committed with the
checkpoint or not at all)."""

from __future__ import annotations

import time
from typing import Any

from plaita.flows import Flow, StepContext
from tests.flows.flowdefs import _count, client

#: The longest a step waits for the test (a test that forgets to release must not hang).
MAX_WAIT_S = 30.0


def release_key(eid: str) -> str:
    return f"plaita:test:release:{eid}"


def _held(ctx: StepContext, *, until_cancel: bool) -> bool:
    """Wait (bounded) for the release key; with ``until_cancel`` a cancel ends the wait too.
    Whether the step was released."""
    deadline_s = time.monotonic() + MAX_WAIT_S
    while time.monotonic() < deadline_s:
        if client().exists(release_key(ctx.execution_id)):
            return True
        if ctx.cancel.wait(0.02) and until_cancel:
            return False
    return False


last = Flow("last")


@last.step
def only(ctx: StepContext) -> dict[str, Any]:
    """The one (so the last) step: stages a write, ignores ``ctx.cancel``, waits for its release."""
    _count(ctx)
    return {"released": _held(ctx, until_cancel=False)}


polite = Flow("polite")


@polite.step
def listen(ctx: StepContext) -> dict[str, Any]:
    """The one step: returns as soon as it sees ``ctx.cancel`` (a deadline or a cancel)."""
    _count(ctx)
    return {"released": _held(ctx, until_cancel=True), "cut": ctx.cancelled}


pause = Flow("pause")


@pause.step
def hold_then_wait(ctx: StepContext) -> Any:
    """Waits for its release (ignoring ``ctx.cancel``), then suspends until an event."""
    if ctx.resume is None:
        _count(ctx)
        _held(ctx, until_cancel=False)
        return ctx.suspend()
    return {"got": ctx.resume.data}


gated = Flow("gated", max_concurrent=1)


@gated.step
def occupy(ctx: StepContext) -> dict[str, Any]:
    """Holds the flow's one slot until released or cancelled."""
    _count(ctx)
    return {"released": _held(ctx, until_cancel=True)}


FLOWS = [last, polite, pause, gated]
