"""Flows with their own retention (``Flow(retention_s=...)``), for the retention tests."""

from __future__ import annotations

from typing import Any

from plaita.flows import Flow, StepContext

brief = Flow("brief", retention_s=120)
forever = Flow("forever", retention_s=0)


@brief.step
def only(ctx: StepContext) -> dict[str, Any]:
    return {"done": True}


@forever.step
def keep(ctx: StepContext) -> dict[str, Any]:
    return {"done": True}


FLOWS = [brief, forever]

#: A flow of a worker of its own in the mixed-fleet test (``test_retention_mixed_fleet``).
month = Flow("month", retention_s=30 * 86400)


@month.step
def monthly(ctx: StepContext) -> dict[str, Any]:
    return {"done": True}
