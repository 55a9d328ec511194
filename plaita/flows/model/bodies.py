"""The task bodies that drive executions (start, resume) and the limits a runner applies.

Pure: builds plain dicts, so the engine, the producer API, the keeper and the CLI agree on one
shape. The execution document itself is ``plaita.flows.model.execution.Execution``.
"""

from __future__ import annotations

from typing import Any

from plaita.tasks import DEFAULT_TENANT

#: What a resume body's ``resume_type`` may be (the names producers already send).
RESUME_TYPES = frozenset({"continue", "retry", "cancel", "timeout", "event"})
#: A restart of a terminal execution from a step (``FlowClient.retry``): not a resume of a
#: suspension, so it is not one of ``RESUME_TYPES`` (``FlowClient.resume`` cannot send it).
RESTART = "restart"
#: What wakes a durable sleep early or at its deadline (``timeout``: an older keeper's wake).
WAKES = frozenset({"continue", "timeout"})
#: The resume a child execution sends its parent when it ends (``plaita.flows.runner.children``).
CHILD_RESUME = "child"
#: A body's W3C trace context (``plaita.flows.tracing``), also the execution document's origin.
TRACEPARENT = "traceparent"
#: Terminal executions expire after this (default 7 days).
DEFAULT_RETENTION_S = 7 * 24 * 3600
#: A state document larger than this is refused (params at start; a step's output ends in error).
DEFAULT_MAX_STATE_BYTES = 512 * 1024


def start_body(
    flow_id: str,
    params: dict[str, Any],
    execution_id: str,
    *,
    dedup_key: str | None = None,
    version: str | None = None,
    deadline_at: float | None = None,
    tenant_id: str | None = None,
) -> dict[str, Any]:
    """``deadline_at``: the whole execution's deadline (epoch seconds); absent = none, so a body
    an older producer sent (or an older worker reads) is unchanged."""
    body: dict[str, Any] = {"type": "start", "flow_id": flow_id, "params": params, "execution_id": execution_id}
    if dedup_key is not None:
        body["dedup_key"] = dedup_key
    if version is not None:
        body["version"] = version
    if deadline_at is not None:
        body["deadline_at"] = deadline_at
    return with_tenant(body, tenant_id)


def with_tenant(body: dict[str, Any], tenant_id: str | None) -> dict[str, Any]:
    """``body`` for ``tenant_id``'s execution: the default tenant's bodies carry no ``tenant_id``
    (exactly the bodies of before tenants existed)."""
    if tenant_id and tenant_id != DEFAULT_TENANT:
        body["tenant_id"] = tenant_id
    return body


def resume_body(
    execution_id: str,
    resume_type: str,
    *,
    flow_id: str | None = None,
    data: Any = None,
    resume_id: str | None = None,
    suspension: int | None = None,
    tenant_id: str | None = None,
    wait_for: str | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"type": "resume", "execution_id": execution_id, "resume_type": resume_type}
    if wait_for is not None:
        body["wait_for"] = wait_for
    if flow_id is not None:
        body["flow_id"] = flow_id
    if data is not None:
        body["data"] = data
    if resume_id is not None:
        body["resume_id"] = resume_id
    if suspension is not None:
        body["suspension"] = suspension
    return with_tenant(body, tenant_id)


def restart_body(
    execution_id: str,
    *,
    flow_id: str | None,
    from_step: str | None,
    force: bool,
    by: str,
    resume_id: str,
    tenant_id: str | None = None,
) -> dict[str, Any]:
    """A restart (``resume_type`` ``restart``) of a terminal execution at ``from_step`` (None:
    the step it ended at); ``force`` allows a completed one."""
    body = resume_body(execution_id, RESTART, flow_id=flow_id, resume_id=resume_id, tenant_id=tenant_id)
    body.update(force=bool(force), by=by)
    if from_step is not None:
        body["from_step"] = from_step
    return body


#: Where the parent's document counts joins per step (``extra``, kept by every version).
JOINS_FIELD = "children"
#: Where a child's document names its parent.
PARENT_FIELD = "parent"


def child_ids(prefix: str, count: int) -> list[str]:
    return [f"{prefix}:{i}" for i in range(count)]


def end_task(doc: dict[str, Any], *, tenant_id: str | None = None) -> dict[str, Any] | None:
    """For a child that ended outside any worker (the keeper's ``Orphaned``): a resume of it,
    a no-op once delivered, whose worker then does what follows its end (``redelivered``: it
    tells the parent). None for an execution that has no parent."""
    link, eid = doc.get(PARENT_FIELD), str(doc.get("execution_id"))
    if not isinstance(link, dict) or not link.get("id"):
        return None
    return resume_body(eid, "continue", flow_id=doc.get("flow_id"), resume_id=f"ended:{eid}", tenant_id=tenant_id)
