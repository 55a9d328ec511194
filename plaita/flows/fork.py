"""Fork (``FlowClient.fork``): a new execution that starts at a step of another one, with the
results of the steps before it copied; the original is never written.

The producer writes the new document ``running`` at the step (its results and state copied, a
fresh history, no dedup key, parent or deadline) together with a start task of the new id
(``plaita.store.forks``). A worker's start finds the document there, as it finds one whose worker
died mid-run, and continues it (``plaita.flows.runner.admit``). The producer does not know the flow's
definition, so it writes ``step_index`` -1: the worker places the execution at its step by name
(``place``) the first time, and drops the results of that step and of those after it in the
flow's order, as ``retry --from-step`` does.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from plaita.clock import wall_s
from plaita.errors import PlaitaError
from plaita.flows.model import bodies as model
from plaita.flows.model.definition import Flow
from plaita.flows.model.execution import BadExecution, Execution, error_doc
from plaita.flows.model.failures import history_entry
from plaita.flows.tracing import producing
from plaita.store.executions.store import QUEUED, ExecutionStore
from plaita.store.forks import record_fork
from plaita.store.keyspace import Keyspace

#: The document field naming where a fork came from: ``{"execution_id", "step", "at", "by"}``.
FORKED_FROM = "forked_from"
#: ``step_index`` of a fork no worker has placed yet.
UNPLACED = -1
#: Fields of the original that are its own and are not copied (a fork is not a child of its
#: parent, joins no trace of the original, and holds no dedup key).
_NOT_COPIED = ("parent", "traceparent", FORKED_FROM)


class NotForkable(PlaitaError):
    """A fork refused: the original never ran the step, is still queued, or the new id is taken."""


def reached_steps(doc: dict[str, Any]) -> set[str]:
    """The steps an execution has run (its history, results and current step)."""
    reached = {e.get("step") for e in doc.get("history") or [] if isinstance(e, dict)}
    reached |= set(doc.get("results") or {}) | {doc.get("step")}
    return {s for s in reached if isinstance(s, str)}


def forked_doc(original: dict[str, Any], new_id: str, from_step: str, *, by: str, now_s: float) -> Execution:
    """The new execution: ``original`` (a stored document) at ``from_step``, running, unplaced.
    Its results (and the events those steps published) are those of the steps completed before
    ``from_step`` first completed (the worker then drops the results of ``from_step`` and of the
    steps after it in the flow's order).
    NotForkable when the original is queued or never ran ``from_step``."""
    source = str(original.get("execution_id"))
    if original.get("status") == QUEUED:
        raise NotForkable(f"execution {source} is queued: it ran no step yet, there is nothing to fork")
    if from_step not in reached_steps(original):
        raise NotForkable(f"execution {source} never ran a step {from_step!r}")
    try:
        ex = Execution.decode(original)
    except BadExecution as exc:
        raise NotForkable(f"execution {source} cannot be forked: {exc}") from None
    results: dict[str, Any] = {}
    for name, value in ex.results.items():
        if name == from_step:
            break
        results[name] = value
    entry = history_entry(from_step, 0, now_s, now_s, "forked")
    entry.update(from_execution=source, by=by)
    origin = {"execution_id": source, "step": from_step, "at": now_s, "by": by}
    extra = {k: v for k, v in ex.extra.items() if k not in _NOT_COPIED}
    return replace(
        ex,
        execution_id=new_id,
        status="running",
        step_index=UNPLACED,
        step=from_step,
        attempt=0,
        results=results,
        resume=None,
        suspension=None,
        history=[entry],
        steps_run=0,
        applied_resumes=[],
        error=None,
        dedup_key=None,
        created_at=now_s,
        updated_at=now_s,
        ended_at=None,
        suspensions=0,
        deadline_at=None,
        inbox=[],
        waiting=None,
        extra={**extra, FORKED_FROM: origin},
    )


def unplaced(execution: Execution) -> bool:
    """A fork no worker has placed at its step yet."""
    return execution.step_index == UNPLACED and FORKED_FROM in execution.extra


def place(execution: Execution, flow: Flow, now_s: float) -> tuple[Execution, bool]:
    """(the fork at its step of ``flow``, True), its results of that step and the later ones
    dropped; or (the fork ended ``error``, False) when ``flow`` has no such step any more."""
    index = flow.index_of(str(execution.step))
    if index is None:
        message = f"forked at step {execution.step!r}, which flow {flow.flow_id!r} does not have"
        return execution.ended("error", now_s, error=error_doc(execution.step, "UnknownStep", message)), False
    dropped = {s.name for s in flow.steps[index:]}
    results = {k: v for k, v in execution.results.items() if k not in dropped}
    return replace(execution, step_index=index, results=results), True


def start_fork(
    store: ExecutionStore, keyspace: Keyspace, original: dict[str, Any], from_step: str, new_id: str, *, by: str
) -> str:
    """``FlowClient.fork`` of the stored document ``original``: the new document and its start,
    written at once; returns ``new_id``. NotForkable when refused (``forked_doc``; the id is taken)."""
    now_s = wall_s()
    fork = forked_doc(original, new_id, from_step, by=by, now_s=now_s)
    body = model.start_body(fork.flow_id, fork.params, new_id, version=fork.version, tenant_id=store.ks.tenant)
    with producing([body], keyspace.queue):
        stream = keyspace.stream(keyspace.partition_of(new_id))
        events = store.events(str(original.get("execution_id")))
        copied = {n: r for n, r in events.items() if r.get("step") in fork.results}
        written = record_fork(store, new_id, fork.encode(), body, stream=stream, now_s=now_s, events=copied)
    if written is None:
        raise NotForkable(f"execution {new_id!r} exists already: a fork never overwrites one")
    return new_id
