"""One step alone, no server: a ``StepContext`` built for a unit test, and the step run on it.

``step_context(...)`` builds the context a worker would hand the step (a cancel flag of its
own, ``ctx.children`` from the ``children`` given, published events recorded in a dict), and
``run_step(flow, "step", ...)`` calls the step with it (sync or ``async def``) and returns
what the step returned beside the context, so a test reads its result, its staged writes and
what it published::

    done = run_step(orders, "ship", params={"lines": [...]}, children=[Child("c1", "completed", {"tracking": "T1"})])
    assert done.value == {"tracking": ["T1"]}
"""

from __future__ import annotations

import asyncio
import inspect
from dataclasses import dataclass, field
from typing import Any

from plaita.flows import Child, Flow, Resume, StepContext
from plaita.tasks import CancelFlag


@dataclass
class StepRun:
    """What one call of a step gave: ``value`` (its return: a dict, None, or a ``Suspend`` /
    ``Sleep`` / ``Spawn``), the ``ctx`` it ran with and the events it published by name."""

    value: Any
    ctx: StepContext
    published: dict[str, Any] = field(default_factory=dict)

    @property
    def staged(self) -> list[tuple[str, str, str]]:
        """(op, key, value text) of each write the step staged (``ctx.stage*``), in order."""
        return [(s.op, s.key, s.value) for s in self.ctx.staged]


def step_context(
    *,
    params: dict[str, Any] | None = None,
    state: dict[str, Any] | None = None,
    results: dict[str, Any] | None = None,
    resume: Resume | None = None,
    children: list[Child] | None = None,
    attempt: int = 1,
    execution_id: str = "test-execution",
    flow_id: str = "test-flow",
    step: str = "test-step",
    deadline_at: float | None = None,
    cancelled: bool = False,
    published: dict[str, Any] | None = None,
) -> StepContext:
    """A ``StepContext`` as a worker builds it. ``children``: the outcomes ``ctx.children`` reads
    (as after a ``spawn`` joined; it sets ``resume``); ``cancelled``: ``ctx.cancel`` already set;
    ``published``: a dict ``ctx.publish`` writes into (the value's last write wins)."""
    if children is not None:
        if resume is not None:
            raise ValueError("give either children or resume: children are a resume of type 'child'")
        resume = Resume("child", [_child_doc(c) for c in children])
    cancel = CancelFlag()
    if cancelled:
        cancel.set()
    sink = published if published is not None else {}
    return StepContext(
        execution_id=execution_id,
        flow_id=flow_id,
        step=step,
        params=dict(params or {}),
        state=dict(state or {}),
        results=dict(results or {}),
        resume=resume,
        attempt=attempt,
        cancel=cancel,
        deadline_at=deadline_at,
        publisher=sink.__setitem__,
    )


def run_step(flow: Flow, step_name: str, **context: Any) -> StepRun:
    """Run ``flow``'s step ``step_name`` once on ``step_context(**context)`` (its ``flow_id`` and
    ``step`` filled in) and return what it gave; what the step raises is raised here."""
    found = next((s for s in flow.steps if s.name == step_name), None)
    if found is None:
        raise ValueError(f"flow {flow.flow_id!r} has no step {step_name!r} (steps: {', '.join(flow.step_names)})")
    published: dict[str, Any] = {}
    context.setdefault("flow_id", flow.flow_id)
    ctx = step_context(step=step_name, published=published, **context)
    value = found.fn(ctx)
    if inspect.isawaitable(value):
        value = asyncio.run(_awaited(value))
    return StepRun(value, ctx, published)


async def _awaited(value: Any) -> Any:
    return await value


def _child_doc(child: Child) -> dict[str, Any]:
    if not isinstance(child, Child):
        raise TypeError(f"children must be plaita.flows.Child values, got {type(child).__name__}")
    return {"execution_id": child.execution_id, "status": child.status, "result": child.result, "error": child.error}
