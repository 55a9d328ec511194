"""Admission: what a task does to its execution before any step runs.

A start creates the execution (or continues one whose worker died mid-run); a resume loads it,
applies the resume or finds it needs nothing (a duplicate, a stale timeout, a terminal
execution); either refuses a task no worker of this definition may run (``BadTaskError``, or a
hand-back to a worker that can: ``plaita.flows.runner.handover``). The result is a ``Run`` for the
engine, or None when the task is a no-op. Every task is safe to deliver twice.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from plaita.config import DEFAULT_VERSION_WAIT_S
from plaita.errors import BadTaskError, LeaseLostError, NotForThisWorker
from plaita.flows import fork
from plaita.flows.io import Created, ExecutionIO
from plaita.flows.model import bodies as model
from plaita.flows.model import inbox
from plaita.flows.model.definition import Flow, FlowRegistry
from plaita.flows.model.execution import BadExecution, Execution, error_doc
from plaita.flows.model.validate import check_wait_name, require_task_json, task_deadline
from plaita.flows.runner.handover import Handover
from plaita.flows.runner.queued import QueuedStarts
from plaita.flows.tracing import TaskTrace
from plaita.store.executions.store import QUEUED
from plaita.tasks import Task

logger = logging.getLogger(__name__)


@dataclass
class Run:
    """One task advancing one execution: ``execution`` is the one last checkpointed."""

    task: Task
    flow: Flow
    execution: Execution
    cancel: bool
    #: The door to its execution's state, as the runner's mode chose it (``plaita.flows.io``).
    io: ExecutionIO
    #: A resume that arrived while the execution was still running (its worker had died):
    #: applied at the next suspension instead of being lost.
    pending: tuple[str, Any, str] | None = None
    #: Decided at admission, to checkpoint instead of running a step (cancelled; refused; a
    #: resume kept for a later wait).
    ending: Execution | None = None
    #: This task created the execution.
    created: bool = False
    #: This task's own last write put the execution in the running index (its create, or a
    #: checkpoint that kept it running): its next still-running checkpoint has no index to move
    #: it from (``ExecutionIO.checkpoint(after_running=)``).
    indexed_running: bool = False
    #: Its spans (``plaita.flows.tracing``), None while tracing is off.
    trace: TaskTrace | None = None
    #: Run by ``run_async`` on the worker's loop (sync steps go to threads), else on a handler thread.
    on_loop: bool = False


#: How long a message to an execution whose start has not run yet waits before it is read again
#: (handed back, no delivery charged; a start parked for a slot stays queued that long or more).
QUEUED_EVENT_WAIT_S = 1.0
#: Creates sent ahead and not yet awaited that one admission keeps; past it the oldest is
#: forgotten (its task, if it still runs, finds its execution created and continues it).
MAX_AHEAD = 1024


@dataclass(slots=True)
class _Ahead:
    """A start's create, sent before its task ran (``Admission.create_ahead``)."""

    flow: Flow
    execution: Execution
    #: The execution's document as sent (for ``_start`` to send again if the write failed).
    text: str
    dedup: str | None
    created: asyncio.Future[Created]


def _ahead_key(task: Task) -> tuple[str, int]:
    """One delivery under one lease: a redelivery (a new generation) never finds an old create."""
    return task.message_id, task.fencing_token


def _retrieved(future: asyncio.Future[Any]) -> None:
    """A create sent ahead whose task never came for it (handed back at a stop) may have failed:
    retrieved here, so asyncio does not report the exception as never retrieved."""
    if not future.cancelled():
        future.exception()


def _decoded(io: ExecutionIO, task: Task, doc: dict[str, Any]) -> Execution:
    try:
        return Execution.decode(doc)
    except BadExecution as exc:  # data, as UnreadableExecution: the key is left for an operator
        key = io.execution_key(task)
        raise BadTaskError(f"execution {task.execution_id!r} is unreadable ({key}: {exc})") from None


class Admission:
    """Turns a task into a ``Run`` (or None: nothing to do)."""

    def __init__(
        self,
        flows: FlowRegistry,
        queue: str,
        *,
        max_state_bytes: int,
        clock: Callable[[], float],
        retention_s: int = model.DEFAULT_RETENTION_S,
        version_wait_s: float = DEFAULT_VERSION_WAIT_S,
        on_child: Callable[[ExecutionIO, Run], Awaitable[Run | None]] | None = None,
    ) -> None:
        self.flows = flows
        #: Mixed fleets: who else runs which flows (``group``: the worker's, set by ``ops.service``).
        self.handover = Handover(queue)
        self.max_state_bytes = max_state_bytes
        self._clock = clock
        self.retention_s, self.version_wait_s = retention_s, version_wait_s
        #: Counts a child's ``child`` resume of its parent (``plaita.flows.runner.children``).
        self.on_child = on_child
        #: Creates sent ahead (``create_ahead``), by delivery: message id and lease generation.
        self._ahead: dict[tuple[str, int], _Ahead] = {}

    async def admit(self, task: Task, io: ExecutionIO) -> Run | None:
        if task.body.get("type") == "start":
            return await self._start(task, io)
        doc, cancel = await io.load(task)
        if doc is None:
            raise BadTaskError(f"resume of unknown execution {task.execution_id!r}")
        if doc.get("status") == QUEUED:  # its start has not run
            if task.body.get("wait_for") is not None:  # a message sent early: kept until the start ran
                raise NotForThisWorker(
                    f"event for {task.body['wait_for']!r} of execution {task.execution_id!r}, whose start has not run",
                    delay_s=QUEUED_EVENT_WAIT_S,
                )
            raise BadTaskError(f"resume of execution {task.execution_id!r}, which is queued (its start has not run)")
        return await self._resume(task, _decoded(io, task, doc), cancel, io)

    async def _flow(self, flow_id: Any, task: Task, io: ExecutionIO) -> Flow:
        flow = self.flows.get(flow_id)
        if flow is None:
            await self.handover.unknown_flow(io, task, flow_id)  # another worker runs it?
            raise BadTaskError(
                f"unknown flow {flow_id!r} (loaded: {', '.join(f.flow_id for f in self.flows) or 'none'})"
            )
        return flow

    async def _start_flow(self, task: Task, io: ExecutionIO) -> Flow:
        body = task.body
        flow = await self._flow(body.get("flow_id"), task, io)
        requested = body.get("version")
        if requested is not None and str(requested) != flow.version and not flow.accepts_version(str(requested)):
            await self.handover.requested_version(io, task, flow.flow_id, str(requested))
            # No live worker runs it: wait for one (a deploy may start it later), then the DLQ.
            reason = await self._queued(io).wait_for_version(task, flow.flow_id, str(requested))
            raise BadTaskError(f"{reason}; loaded here is {flow.version!r}")
        return flow

    async def _start(self, task: Task, io: ExecutionIO) -> Run | None:
        ahead = self._ahead.pop(_ahead_key(task), None)
        if ahead is not None:  # its create went out while the task waited (``create_ahead``)
            flow, execution, dedup = ahead.flow, ahead.execution, ahead.dedup
            try:
                code, other, cancel = await ahead.created
            except Exception:  # sent before the task ran (Redis may be back): the same call now
                code, other, cancel = await io.create(task, ahead.text, execution.created_at, dedup)
        else:
            try:
                flow = await self._start_flow(task, io)
                execution, text, dedup = self._new_execution(task, flow)
            except BadTaskError as exc:  # to the DLQ: its queued record ends with the reason
                await self._queued(io).dead_lettered(task, exc.reason)
                raise
            code, other, cancel = await io.create(task, text, execution.created_at, dedup)
        eid = task.execution_id
        if code == 0:
            raise LeaseLostError(f"lease of execution {eid} lost before it was created")
        if code == 2:
            logger.info("start of execution %s: dedup key %r already started %s; duplicate ignored", eid, dedup, other)
            return None
        if code == 3:  # it exists: continue it if its worker died mid-run
            existing = io.parse(task, other)
            assert existing is not None  # the script returns code 3 only with a state
            return await self._restart(Run(task, flow, _decoded(io, task, existing), cancel, io))
        return Run(task, flow, execution, cancel, io, created=True, indexed_running=True)

    def _new_execution(self, task: Task, flow: Flow) -> tuple[Execution, str, str | None]:
        """The execution a start creates, its document and its dedup key; BadTaskError for a
        start no worker can create."""
        body, eid = task.body, task.execution_id
        params = {} if body.get("params") is None else body.get("params")
        if not isinstance(params, dict):
            raise BadTaskError(f"start 'params' must be a JSON object (got {type(params).__name__})")
        dedup = str(body["dedup_key"]) if body.get("dedup_key") not in (None, "") else None
        deadline_at = task_deadline(body)
        require_task_json(params, "start 'params'")
        parent = body["parent"] if isinstance(body.get("parent"), dict) else None  # a child: it tells its parent
        execution = Execution.start(
            eid, flow, params, dedup_key=dedup, now_s=self._clock(), deadline_at=deadline_at, parent=parent
        )
        text = execution.encode()
        if len(text.encode("utf-8")) > self.max_state_bytes:
            raise BadTaskError(f"start params make a state over the {self.max_state_bytes}-byte limit")
        return execution, text, dedup

    def create_ahead(self, io: ExecutionIO, task: Task, flow: Flow) -> None:
        """Send the create of ``task``, a start of ``flow`` that holds its lease and waits to
        run, now (on the runner's loop): the creates of the starts a read brought go out in one
        write, and each task, when it runs, awaits its reply instead of a round trip of its own.
        The same fenced call, so it means what it means in ``_start`` (a duplicate or a taken
        dedup key writes nothing). Only a start that ``_start`` would create without any other
        I/O goes ahead; anything else (a version to hand over, bad params) is left to it."""
        requested = task.body.get("version")
        if requested is not None and str(requested) != flow.version and not flow.accepts_version(str(requested)):
            return
        try:
            execution, text, dedup = self._new_execution(task, flow)
        except Exception:  # its own admission meets the same error and reports it
            return
        created = io.create_ahead(task, text, execution.created_at, dedup)
        if created is None:  # this door sends nothing ahead (thread mode, a cluster, a tenant's first create)
            return
        created.add_done_callback(_retrieved)
        if len(self._ahead) >= MAX_AHEAD:  # tasks handed back unstarted never come for theirs
            self._ahead.pop(next(iter(self._ahead)))
        self._ahead[_ahead_key(task)] = _Ahead(flow, execution, text, dedup, created)

    def _queued(self, io: ExecutionIO) -> QueuedStarts:
        """The producer's queued records (each task's tenant's, through ``io``), as this admission sees them."""
        return QueuedStarts(io, version_wait_s=self.version_wait_s, retention_s=self.retention_s, clock=self._clock)

    async def _restart(self, run: Run) -> Run | None:
        execution, eid = run.execution, run.task.execution_id
        if execution.flow_id != run.flow.flow_id:
            raise BadTaskError(f"execution {eid!r} belongs to flow {execution.flow_id!r}, not {run.flow.flow_id!r}")
        if execution.status != "running":
            logger.info("start of execution %s: already %s; duplicate ignored", eid, execution.status)
            return None
        if fork.unplaced(execution):  # a fork's first start: at its step by name (plaita.flows.fork)
            placed, ok = fork.place(execution, run.flow, self._clock())
            if not ok:
                run.ending = placed
                return run
            run.execution = placed
        return await self._compatible(run)

    async def _resume(self, task: Task, execution: Execution, cancel: bool, io: ExecutionIO) -> Run | None:
        body, eid = task.body, task.execution_id
        flow_id = body.get("flow_id")
        if flow_id is not None and flow_id != execution.flow_id:
            raise BadTaskError(
                f"resume for flow {flow_id!r} of execution {eid!r}, which runs flow {execution.flow_id!r}"
            )
        flow = await self._flow(execution.flow_id, task, io)
        rtype = body.get("resume_type", "continue")
        if rtype == model.RESTART:
            return await self._reopen(task, flow, execution, cancel, io)
        if rtype == model.CHILD_RESUME:
            return await self._child(Run(task, flow, execution, cancel, io))
        if rtype not in model.RESUME_TYPES:
            raise BadTaskError(
                f"unknown resume_type {rtype!r} (expected one of {', '.join(sorted(model.RESUME_TYPES))})"
            )
        rid = str(body.get("resume_id") or task.message_id)
        wait_for = _wait_for(body, rtype)
        applied = rid in execution.applied_resumes
        # Applied but still running: the worker that applied it died in a later step, and this
        # is its redelivery (the lease rules out a live one). Continue, as a start does.
        # A timeout, or a sleep's wake, names its suspension: a late one is stale.
        stale = (rtype == "timeout" or "suspension" in body) and execution.stale_timeout(body.get("suspension"))
        if execution.terminal or (applied and execution.status != "running") or stale:
            lost = wait_for is not None and execution.terminal and not applied  # no wait can take it now
            (logger.warning if lost else logger.info)(
                "resume %s (%s) of execution %s (%s): nothing to do", rid, wait_for or rtype, eid, execution.status
            )
            return None
        run = await self._compatible(Run(task, flow, execution, cancel, io))
        if run is None or applied or run.ending is not None:
            return run
        return self._resumed(run, rtype, rid, wait_for)

    async def _child(self, run: Run) -> Run | None:
        """A child's notification (``plaita.flows.runner.children``): counted by ``on_child``."""
        if run.execution.terminal:
            return None
        compatible = await self._compatible(run)
        if compatible is None or compatible.ending is not None or self.on_child is None:
            return compatible
        if compatible.cancel or compatible.execution.past_deadline(self._clock()):
            compatible.ending = compatible.execution.cancelled(self._clock())
            return compatible
        counted = await self.on_child(run.io, compatible)
        return counted

    def _resumed(self, run: Run, rtype: str, rid: str, wait_for: str | None) -> Run | None:
        """``run`` with resume ``rid`` applied: now (suspended), at the next suspension (still
        running: its worker died), or as the execution's end (a cancel, or past its deadline).
        One addressed to a wait the execution is not in is kept for it (``plaita.flows.model.inbox``)."""
        body, now_s = run.task.body, self._clock()
        if rtype == "cancel" or run.cancel or run.execution.past_deadline(now_s):
            run.ending = run.execution.cancelled(now_s)
            return run
        require_task_json(body.get("data"), "resume 'data'")
        if wait_for is not None and not inbox.accepts(run.execution, wait_for):
            parked = inbox.park(run.execution, rtype, body.get("data"), rid, wait_for, now_s)
            if run.execution.status == "running":  # its worker died: written with the next checkpoint
                run.execution = parked
            else:
                run.ending = parked  # written, and nothing runs
            return run
        if run.execution.sleeping_now:
            return self._woken(run, rtype, rid)
        if run.execution.status == "suspended":
            run.execution = run.execution.resumed(rtype, body.get("data"), rid, now_s)
        elif rtype != "retry":
            run.pending = (rtype, body.get("data"), rid)
        return run

    def _woken(self, run: Run, rtype: str, rid: str) -> Run | None:
        """A sleeping execution resumed: ``continue`` (the keeper's, at the deadline, or anyone's,
        earlier) or ``timeout`` ends the sleep and the next step runs; anything else is ignored."""
        ex, eid = run.execution, run.task.execution_id
        until = (ex.suspension or {}).get("deadline")
        if rtype not in model.WAKES:
            logger.warning("resume %s (%s) of execution %s: it sleeps until %s; ignored", rid, rtype, eid, until)
            return None
        following, now_s = (ex.suspension or {}).get("next"), self._clock()
        if following is None:  # the last step slept: the execution is over
            run.ending = ex.woke(None, rid, now_s)
            return run
        index = run.flow.index_of(str(following))
        if index is None:
            message = f"the step after the sleep, {following!r}, is not in flow {run.flow.flow_id!r}"
            run.ending = ex.ended("error", now_s, error=error_doc(ex.step, "UnknownStep", message))
            return run
        run.execution = ex.woke((index, str(following)), rid, now_s)
        return run

    async def _reopen(self, task: Task, flow: Flow, execution: Execution, cancel: bool, io: ExecutionIO) -> Run | None:
        """A restart (``FlowClient.retry``): a terminal execution back to ``running`` at a step,
        written under the lease (``ExecutionStore.reopen``) before the step runs. Known by its
        resume id: a redelivery is a no-op, or continues it if its worker died after the reopen."""
        body, eid = task.body, task.execution_id
        rid = str(body.get("resume_id") or task.message_id)
        if rid in execution.applied_resumes:
            if execution.status != "running":
                logger.info("restart %s of execution %s (%s): already applied", rid, eid, execution.status)
                return None
            return await self._compatible(Run(task, flow, execution, cancel, io))
        if not execution.terminal or (execution.status == "completed" and not body.get("force")):
            logger.warning("restart %s of execution %s refused: it is %s", rid, eid, execution.status)
            return None
        # The cancel flag of a cancelled execution is stale: the reopen deletes it.
        run = await self._compatible(Run(task, flow, execution, False, io))
        if run is None or run.ending is not None:
            raise BadTaskError(f"restart of execution {eid!r}: flow {flow.flow_id!r} changed, cannot continue it")
        name = str(body.get("from_step") or execution.step)
        index = flow.index_of(name)
        if index is None:
            raise BadTaskError(f"restart of execution {eid!r}: flow {flow.flow_id!r} has no step {name!r}")
        dropped = [s.name for s in flow.steps[index:]]
        now_s = self._clock()
        by = str(body.get("by") or "unknown")
        reopened = run.execution.restarted((index, name), dropped, rid, by, now_s).stamped(now_s)
        try:
            text = reopened.encode()
        except (TypeError, ValueError) as exc:
            raise BadTaskError(f"restart of execution {eid!r}: its document is not strict JSON ({exc})") from None
        if not await io.reopen(task, text, now_s, dropped):
            raise LeaseLostError(f"lease of execution {eid} lost before its restart was written")
        logger.info("execution %s restarted from step %r by %s (was %s)", eid, name, by, execution.status)
        run.execution = reopened
        return run

    async def _compatible(self, run: Run) -> Run | None:
        """``run`` if its flow definition can continue it (upgraded to a compatible version).
        Else the task goes to a worker that can (``NotForThisWorker``, see plaita.flows.runner.handover);
        only when none can and this worker is not the older one does the execution end in
        ``error`` (``run.ending``)."""
        execution, flow = run.execution, run.flow
        if execution.fingerprint == flow.fingerprint:
            return run
        index = flow.index_of(str(execution.step))
        if index is not None and flow.accepts_version(execution.version):
            run.execution = execution.upgraded(flow, index)
            return run
        await self.handover.cannot_continue(run.io, run.task, flow, execution.to_doc())
        message = (
            f"flow {flow.flow_id!r} changed since this execution started (steps renamed, added or reordered; "
            f"version {execution.version!r} -> {flow.version!r}): refused. Declare a compatible version to allow it"
        )
        logger.error("execution %s: %s", run.task.execution_id, message)
        error = error_doc(execution.step, "FlowChanged", message)
        run.ending = execution.ended("error", self._clock(), error=error)
        return run


def _wait_for(body: dict[str, Any], rtype: str) -> str | None:
    """The wait a resume task is addressed to (None: unaddressed); BadTaskError for a bad one."""
    try:
        wait_for = check_wait_name(body.get("wait_for"), "resume 'wait_for'")
    except ValueError as exc:
        raise BadTaskError(str(exc)) from None
    if wait_for is not None and rtype != "event":
        raise BadTaskError(f"resume 'wait_for' addresses an event; a {rtype!r} resume takes none")
    return wait_for
