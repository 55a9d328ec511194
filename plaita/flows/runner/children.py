"""Child executions: fan-out (a step's ``ctx.spawn``) and fan-in (the join), without a lock.

Fan-out. A step returns ``ctx.spawn(flow, [params, ...])``. Child ``i`` is
``{parent}:{step}:{k}:{i}``, ``k`` the joins that step has had so far (``children.joins`` in
the parent's document), so a step that runs again before its join (redelivered, retried,
resumed) names the same children and starts no second set. The spawn reads the children that
exist (one pipelined GET each, every key in its own slot), enqueues a start for each one that does
not, then the parent's checkpoint suspends it on them (``suspension.children``: prefix, count, the
indexes known to have ended). Starts are enqueued before the checkpoint, so a crash between the
two re-runs the step, which finds them; a start delivered twice is a no-op (the child's id).

Fan-in. A child's terminal checkpoint is followed by adding its index to its spawn's done set
(``plaita:execution:children:…``, a set in the parent's slot, kept while the parent waits and
turned into an expiring marker when it joins: one key, one script; a repeated add is a no-op,
with no cap like ``applied_resumes``' 100). The child whose add completes the set enqueues one
``resume`` of the parent, type ``child``; a later no-op delivery of one of its tasks does both
again, so a crash between its checkpoint and the enqueue loses nothing. Children never queue on
the parent's lease: only that one resume does. The parent's task reads every child (GETs, no
transaction: an ended child stays ended) and the step runs again with their outcomes in
``ctx.resume`` (type ``child``: ``ctx.children``); the resume is a no-op when the parent is no
longer waiting on that spawn. Right after its suspension checkpoint the spawning task looks at
the done set once more, so children that all ended before it suspended are joined at once. A
notification reaching a parent that is still ``running`` (its worker died before it suspended)
continues it: the step runs again and its spawn sees the children that already ended.

Cancel. A parent that ends ``cancelled`` while waiting sets each child's cancel flag and sends a
``cancel`` resume to each (a suspended child is cancelled at once).

Orphaned. A child the keeper ends in ``error`` (``Orphaned``: no worker left) gets, in the same
transaction, a task of its own (``end_task``): a no-op whose worker notifies the parent as after
any other end, so the parent is woken like by any terminal child.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from plaita.flows.io import ExecutionIO
from plaita.flows.model import bodies as model
from plaita.flows.model.bodies import JOINS_FIELD, PARENT_FIELD, child_ids
from plaita.flows.model.context import Spawn
from plaita.flows.model.execution import BadExecution, Execution
from plaita.flows.runner.admit import Run
from plaita.flows.tracing import current_traceparent
from plaita.store.executions.store import TERMINAL, UnreadableExecution
from plaita.tasks import Task

logger = logging.getLogger(__name__)


def needs_ending(ex: Execution) -> bool:
    """Whether ``Children.ended`` has anything to do for ``ex`` (a parent to tell, or children
    to cancel); a superset of what it acts on, so the caller may skip it when False."""
    waiting = (ex.suspension or {}).get("children")
    return isinstance(ex.extra.get(PARENT_FIELD), dict) or (ex.status == "cancelled" and isinstance(waiting, dict))


def _outcome(eid: str, doc: dict[str, Any] | None | UnreadableExecution) -> dict[str, Any] | None:
    """A terminal child's outcome as ``ctx.children`` shows it; None while it has not ended."""
    if not isinstance(doc, dict) or doc.get("status") not in TERMINAL:
        return None
    status = str(doc["status"])
    results = doc.get("results")
    result = results.get(doc.get("step")) if status == "completed" and isinstance(results, dict) else None
    return {"execution_id": eid, "status": status, "result": result, "error": doc.get("error")}


class Children:
    """Spawns, joins and cancels children through the runner's door (``ExecutionIO``); holds no state."""

    # -- fan-out -----------------------------------------------------------------------
    async def spawn(self, io: ExecutionIO, run: Run, step: str, spawn: Spawn, suspended: Execution) -> Execution:
        """The execution the spawning step checkpoints: ``suspended`` waiting on its children, or
        already resumed with their outcomes when every one has ended (a re-run step)."""
        parent, task = run.task.execution_id, run.task
        joins = dict(suspended.extra.get(JOINS_FIELD) or {})
        prefix = f"{parent}:{step}:{int(joins.get(step, 0))}"
        ids = child_ids(prefix, len(spawn.params))
        docs = await io.read_many(task, ids)
        outcomes = [_outcome(e, d) for e, d in zip(ids, docs, strict=True)]
        if all(o is not None for o in outcomes):
            return await self._joined(io, task, suspended, step, prefix, outcomes, prefix)
        link = {"id": parent, "flow_id": run.flow.flow_id, "prefix": prefix, "count": len(ids)}
        bodies = []
        traceparent = current_traceparent()  # the spawning step's span: each child joins its trace
        tenant = io.tenant(task)  # children are executions of their parent's tenant
        for i, (eid, doc) in enumerate(zip(ids, docs, strict=True)):
            if doc is None:  # an existing child has (had) its task: starting it again is a no-op
                # A child inherits the parent's deadline: it is cancelled past it too.
                body = model.start_body(
                    spawn.flow_id, spawn.params[i], eid, deadline_at=suspended.deadline_at, tenant_id=tenant
                )
                if traceparent is not None:
                    body[model.TRACEPARENT] = traceparent
                bodies.append({**body, PARENT_FIELD: {**link, "index": i}})
        await io.enqueue(task, bodies)
        waiting = {"flow_id": spawn.flow_id, "prefix": prefix, "count": len(ids)}
        logger.info("execution %s: step %r started %d children (%s:*)", parent, step, len(bodies), prefix)
        return replace(suspended, suspension={**(suspended.suspension or {}), "children": waiting})

    async def _joined(
        self, io: ExecutionIO, task: Task, ex: Execution, step: str, prefix: str, outcomes: list[Any], resume_id: str
    ) -> Execution:
        """``ex`` (suspended on children) running again, the outcomes its step will see; the
        step's join count moves on, so a later spawn of the same step names new children. Its
        done set is closed first: were the checkpoint lost, the join is redone from the
        children's own documents, never from the set."""
        await io.close_spawn(task, ex.execution_id, prefix)
        joins = dict(ex.extra.get(JOINS_FIELD) or {})
        joins[step] = int(joins.get(step, 0)) + 1
        resumed = replace(ex, extra={**ex.extra, JOINS_FIELD: joins})
        return resumed.resumed(model.CHILD_RESUME, outcomes, resume_id)

    async def settled(self, io: ExecutionIO, run: Run) -> Execution | None:
        """Right after the checkpoint that suspended ``run`` on its children: the joined
        execution when every child ended meanwhile (their last notification found the lease
        taken and would wait for a reclaim), else None."""
        waiting = (run.execution.suspension or {}).get("children")
        if not isinstance(waiting, dict):
            return None
        count = await io.children_done(run.task, run.task.execution_id, str(waiting["prefix"]))
        if count < int(waiting["count"]) and count != -1:
            return None
        return await self._join(io, run.task, run.execution, waiting, str(waiting["prefix"]))

    # -- fan-in (the parent's task) ----------------------------------------------------------
    async def noted(self, io: ExecutionIO, run: Run) -> Run | None:
        """A ``child`` resume of ``run``'s execution (sent by the child whose end completed the
        set): joined (``run.execution`` running again) or a no-op."""
        ex, body = run.execution, run.task.body
        if ex.status == "running":  # its worker died mid-spawn: the step runs again and re-reads
            return run
        waiting = (ex.suspension or {}).get("children")
        raw = body.get("data")
        data: dict[str, Any] = raw if isinstance(raw, dict) else {}
        if ex.status != "suspended" or not isinstance(waiting, dict) or data.get("prefix") != waiting.get("prefix"):
            logger.info("execution %s: child notification %s not awaited; ignored", ex.execution_id, body)
            return None
        joined = await self._join(io, run.task, ex, waiting, str(body.get("resume_id") or waiting["prefix"]))
        if joined is None:
            return None
        run.execution = joined
        return run

    async def _join(
        self, io: ExecutionIO, task: Task, ex: Execution, waiting: dict[str, Any], resume_id: str
    ) -> Execution | None:
        """``ex`` running again with its children's outcomes, or None while one has not ended
        (GETs of each child, no transaction: an ended child stays ended)."""
        ids = child_ids(str(waiting["prefix"]), int(waiting["count"]))
        outcomes = [_outcome(e, d) for e, d in zip(ids, await io.read_many(task, ids), strict=True)]
        missing = [i for i, o in enumerate(outcomes) if o is None]
        if missing:
            logger.warning("execution %s: children %s not ended yet; still waiting", ex.execution_id, missing[:10])
            return None
        step = str((ex.suspension or {}).get("step") or ex.step)
        logger.info("execution %s: %d children joined", ex.execution_id, len(ids))
        return await self._joined(io, task, ex, step, str(waiting["prefix"]), outcomes, resume_id)

    # -- after an execution ended ------------------------------------------------------------
    async def ended(self, io: ExecutionIO, task: Task, ex: Execution) -> None:
        """After ``ex``'s terminal checkpoint: tell its parent; cancel its children if it was
        cancelled while waiting on them."""
        await self.notify_parent(io, task, ex)
        waiting = (ex.suspension or {}).get("children")
        if ex.status == "cancelled" and isinstance(waiting, dict):
            await self._cancel_children(io, task, ex, waiting)

    async def notify_parent(self, io: ExecutionIO, task: Task, ex: Execution) -> None:
        link = ex.extra.get(PARENT_FIELD)
        if not ex.terminal or not isinstance(link, dict) or not link.get("id") or not link.get("prefix"):
            return
        parent, prefix = str(link["id"]), str(link["prefix"])
        ended = await io.mark_child_done(task, parent, prefix, int(link.get("index") or 0))
        if ended < int(link.get("count") or 0):
            return  # not the last (the one that completes the set wakes the parent), or joined already
        body = model.resume_body(
            str(link["id"]),
            model.CHILD_RESUME,
            flow_id=link.get("flow_id"),
            data={"prefix": prefix},
            resume_id=f"children:{prefix}",
            tenant_id=io.tenant(task),
        )
        await io.enqueue(task, [body])

    async def _cancel_children(self, io: ExecutionIO, task: Task, ex: Execution, waiting: dict[str, Any]) -> None:
        ids = child_ids(str(waiting["prefix"]), int(waiting["count"]))
        await io.request_cancels(task, ids)
        docs = await io.read_many(task, ids)
        tenant = io.tenant(task)
        bodies = [
            model.resume_body(eid, "cancel", flow_id=doc.get("flow_id"), tenant_id=tenant)
            for eid, doc in zip(ids, docs, strict=True)
            if isinstance(doc, dict) and doc.get("status") == "suspended"
        ]
        await io.enqueue(task, bodies)
        logger.info("execution %s cancelled: cancel requested for its %d children", ex.execution_id, len(ids))

    async def redelivered(self, io: ExecutionIO, task: Task) -> None:
        """A task of its execution was a no-op: if it has ended, do again what follows its end
        (its worker may have died between the terminal checkpoint and the notification)."""
        try:
            doc = await io.get(task, task.execution_id)
        except UnreadableExecution:
            return
        if doc is None or doc.get("status") not in TERMINAL:
            return
        if not isinstance(doc.get(PARENT_FIELD), dict) and "children" not in (doc.get("suspension") or {}):
            return
        try:
            ended = Execution.decode(doc)
        except BadExecution:  # left for an operator, as admission leaves it
            return
        await self.ended(io, task, ended)
