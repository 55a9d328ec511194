"""``FlowRunner``: the worker handler that advances executions one checkpointed step at a time.

The worker gives every task the execution's lease (generation ``task.fencing_token``) before
the handler runs, so one execution never advances on two workers at once. After each step
the runner writes one fenced checkpoint (state, step index, status index, staged writes);
a worker killed during step k leaves the checkpoint of step k-1, and whoever runs the
execution next starts at step k. Every task is safe to deliver twice: a start of an existing
execution only continues it if it is still running, a resume already applied (or of a
terminal execution) is a no-op.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import random
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from plaita.errors import BadTaskError
from plaita.flows import model
from plaita.flows.checkpoint import Checkpointer, LeaseLostError, Run, call_io, encode
from plaita.flows.context import Resume, StepContext, Suspend
from plaita.flows.definition import Flow, FlowRegistry, Step
from plaita.flows.handover import Handover, fleet_entry, upgrade
from plaita.flows.invoke import invoke
from plaita.flows.validate import StepOutputError, require_task_json
from plaita.flows.watch import CancelWatch
from plaita.runtime.observer import ExecutionObserver
from plaita.store.executions import TERMINAL, ExecutionStore
from plaita.tasks import CancelFlag, Task

logger = logging.getLogger(__name__)

#: Checkpoint status -> the execution event observers are told (``running`` is no event).
_STATUS_EVENTS = {"suspended": "suspended", "completed": "completed", "error": "failed", "cancelled": "cancelled"}


class FlowRunner:
    """A handler (``runner(task)``) running the flows of ``flows`` on ``store``.

    Called from a handler thread it runs ``async def`` steps on a per-thread event loop;
    ``await runner.run_async(task)`` runs on the caller's loop, with sync steps and Redis calls
    moved to threads so the loop is never blocked.
    """

    def __init__(
        self,
        flows: FlowRegistry | Iterable[Flow],
        store: ExecutionStore,
        *,
        retention_s: int = model.DEFAULT_RETENTION_S,
        max_state_bytes: int = model.DEFAULT_MAX_STATE_BYTES,
        cancel_poll_s: float = 0.5,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.time,
        observer: ExecutionObserver | None = None,
    ) -> None:
        self.flows = flows if isinstance(flows, FlowRegistry) else FlowRegistry(flows)
        self.store = store
        self.max_state_bytes = max_state_bytes
        #: Told about executions and steps (metrics); set it before the first task runs.
        self.observer = observer
        self._checkpoints = Checkpointer(
            store, retention_s=retention_s, max_state_bytes=max_state_bytes, clock=clock, on_saved=self._saved
        )
        self._rng = rng or random.Random()
        self._clock = clock
        self._watch = CancelWatch(store, poll_s=cancel_poll_s)
        #: Mixed fleets: who else runs which flows (set ``handover.group`` to the worker's group).
        self.handover = Handover(store.client, store.ks.queue)
        self._local = threading.local()
        self._loops: list[asyncio.AbstractEventLoop] = []
        self._loops_lock = threading.Lock()

    # -- entry points --------------------------------------------------------------------
    def __call__(self, task: Task) -> None:
        # In thread mode nothing in the runner suspends (Redis calls block, async steps run to
        # completion on this thread's loop in _invoke), so the coroutine is driven by hand: no
        # event loop is running while a sync step runs, and it may call asyncio.run itself.
        coro = self._handle(task, offload=False)
        try:
            coro.send(None)
        except StopIteration:
            return
        coro.close()
        raise RuntimeError("flow runner suspended outside an event loop (a plaita bug)")

    def _thread_loop(self) -> asyncio.AbstractEventLoop:
        loop: asyncio.AbstractEventLoop | None = getattr(self._local, "loop", None)
        if loop is None:
            loop = self._local.loop = asyncio.new_event_loop()
            with self._loops_lock:
                self._loops.append(loop)
        return loop

    async def run_async(self, task: Task) -> None:
        await self._handle(task, offload=True)

    def fleet_entry(self) -> dict[str, Any]:
        """What this runner runs, for the worker's registry entry."""
        return fleet_entry(self.flows)

    def close(self) -> None:
        """Stop the cancel watcher and close the per-thread loops (call once no task runs)."""
        self._watch.stop()
        with self._loops_lock:
            loops, self._loops = self._loops, []
        for loop in loops:
            if not loop.is_running():
                loop.close()

    # -- dispatch ------------------------------------------------------------------------
    async def _handle(self, task: Task, *, offload: bool) -> None:
        if task.body.get("type") == "start":
            run = await self._begin_start(task, offload)
        else:
            doc, cancel = await call_io(offload, self.store.load, task.execution_id)
            run = await self._begin_resume(task, doc, cancel, offload)
        if run is None:
            return
        observer, flow_id = self.observer, run.flow.flow_id
        if observer is not None:
            observer.run_began(flow_id)
        try:
            await self._advance(run)
        finally:
            if observer is not None:
                observer.run_ended(flow_id)

    def _saved(self, run: Run, status: str) -> None:
        event = _STATUS_EVENTS.get(status)
        if event is not None and self.observer is not None:
            self.observer.execution_event(run.flow.flow_id, event)

    async def _flow(self, flow_id: Any, task: Task, offload: bool) -> Flow:
        flow = self.flows.get(flow_id)
        if flow is None:
            await call_io(offload, self.handover.unknown_flow, task, flow_id)  # another worker runs it?
            raise BadTaskError(
                f"unknown flow {flow_id!r} (loaded: {', '.join(f.flow_id for f in self.flows) or 'none'})"
            )
        return flow

    async def _begin_start(self, task: Task, offload: bool) -> Run | None:
        body, eid = task.body, task.execution_id
        flow = await self._flow(body.get("flow_id"), task, offload)
        params = body.get("params")
        params = {} if params is None else params
        if not isinstance(params, dict):
            raise BadTaskError(f"start 'params' must be a JSON object (got {type(params).__name__})")
        requested = body.get("version")
        if requested is not None and str(requested) != flow.version and not flow.accepts_version(str(requested)):
            await call_io(offload, self.handover.requested_version, task, flow.flow_id, str(requested))
            raise BadTaskError(f"flow {flow.flow_id!r} version {requested!r} requested; loaded is {flow.version!r}")
        dedup = body.get("dedup_key")
        dedup = str(dedup) if dedup not in (None, "") else None
        doc = model.new_execution(eid, flow, params, dedup_key=dedup, now_s=self._clock())
        require_task_json(params, "start 'params'")
        text = encode(doc)
        if len(text.encode("utf-8")) > self.max_state_bytes:
            raise BadTaskError(f"start params make a state over the {self.max_state_bytes}-byte limit")
        created_at = doc["created_at"]
        code, other, cancel = await call_io(
            offload, self.store.create, eid, task.fencing_token, text, created_at, dedup
        )
        if code == 0:
            raise LeaseLostError(f"lease of execution {eid} lost before it was created")
        if code == 2:
            logger.info("start of execution %s: dedup key %r already started %s; duplicate ignored", eid, dedup, other)
            return None
        if code == 3:
            existing = self.store.parse(eid, other)
            assert existing is not None  # the script returns code 3 only with a state
            return await self._restart(Run(task, flow, existing, cancel, offload))
        if self.observer is not None:
            self.observer.execution_event(flow.flow_id, "started")
        return Run(task, flow, doc, cancel, offload)

    async def _restart(self, run: Run) -> Run | None:
        """A start of an execution that exists: continue it if its worker died mid-run."""
        doc, eid = run.doc, run.task.execution_id
        if doc.get("flow_id") != run.flow.flow_id:
            raise BadTaskError(f"execution {eid!r} belongs to flow {doc.get('flow_id')!r}, not {run.flow.flow_id!r}")
        if doc.get("status") != "running":
            logger.info("start of execution %s: already %s; duplicate ignored", eid, doc.get("status"))
            return None
        return run if await self._compatible(run) else None

    async def _begin_resume(self, task: Task, doc: dict[str, Any] | None, cancel: bool, offload: bool) -> Run | None:
        body, eid = task.body, task.execution_id
        if doc is None:
            raise BadTaskError(f"resume of unknown execution {eid!r}")
        flow_id = body.get("flow_id")
        if flow_id is not None and flow_id != doc.get("flow_id"):
            raise BadTaskError(
                f"resume for flow {flow_id!r} of execution {eid!r}, which runs flow {doc.get('flow_id')!r}"
            )
        flow = await self._flow(doc.get("flow_id"), task, offload)
        rtype = body.get("resume_type", "continue")
        if rtype not in model.RESUME_TYPES:
            raise BadTaskError(
                f"unknown resume_type {rtype!r} (expected one of {', '.join(sorted(model.RESUME_TYPES))})"
            )
        rid = str(body.get("resume_id") or task.message_id)
        status = doc.get("status")
        applied = rid in doc.get("applied_resumes", [])
        # Applied but still running: the worker that applied it died in a later step, and this
        # is its redelivery (the lease rules out a live one). Continue, as a start does.
        if status in TERMINAL or (applied and status != "running") or model.stale_timeout(body, doc, rtype):
            logger.info("resume %s (%s) of execution %s (%s): nothing to do", rid, rtype, eid, status)
            return None
        run = Run(task, flow, doc, cancel, offload)
        if not await self._compatible(run):
            return None
        if applied:
            return run
        if rtype == "cancel" or cancel:
            await self._end(run, "cancelled")
            return None
        require_task_json(body.get("data"), "resume 'data'")
        if status == "suspended":
            model.apply_resume(doc, rtype, body.get("data"), rid)
        elif rtype != "retry":
            run.pending = (rtype, body.get("data"), rid)
        return run

    async def _compatible(self, run: Run) -> bool:
        """True if ``run``'s flow definition can continue it. Else the task goes to a worker that
        can (``NotForThisWorker``, see plaita.flows.handover); only when none can and this
        worker is not the older one does the execution end in ``error``."""
        doc, flow = run.doc, run.flow
        if doc.get("fingerprint") == flow.fingerprint:
            return True
        index = flow.index_of(str(doc.get("step")))
        if index is not None and flow.accepts_version(doc.get("version")):
            upgrade(doc, flow, index)
            return True
        await call_io(run.offload, self.handover.cannot_continue, run.task, flow, doc)
        message = (
            f"flow {flow.flow_id!r} changed since this execution started (steps renamed, added or reordered; "
            f"version {doc.get('version')!r} -> {flow.version!r}): refused. Declare a compatible version to allow it"
        )
        logger.error("execution %s: %s", run.task.execution_id, message)
        doc["error"] = model.error_doc(doc.get("step"), "FlowChanged", message)
        await self._end(run, "error")
        return False

    # -- advancing -----------------------------------------------------------------------
    async def _advance(self, run: Run) -> None:
        # Every step ends in a checkpoint; the checkpoint's status (not the step's wish: an
        # oversized state turns into ``error``) decides whether another step runs.
        while run.doc.get("status") == "running":
            if run.task.cancelled.is_set():
                raise LeaseLostError(f"lease of execution {run.task.execution_id} lost")
            if run.cancel:
                await self._end(run, "cancelled")
                return
            await self._run_step(run, run.flow.steps[int(run.doc["step_index"])])
        if run.pending is not None:
            logger.info(
                "execution %s ended without suspending: resume %s was not needed", run.task.execution_id, run.pending[2]
            )

    async def _run_step(self, run: Run, step: Step) -> bool:
        """Run ``step`` once; True when the execution left ``running`` (suspended or ended)."""
        doc = run.doc
        resume = doc.get("resume")
        ctx = StepContext(
            execution_id=run.task.execution_id,
            flow_id=run.flow.flow_id,
            step=step.name,
            params=doc.get("params") or {},
            state=copy.deepcopy(doc.get("state") or {}),
            results=doc.get("results") or {},
            resume=Resume(resume.get("type", "continue"), resume.get("data")) if isinstance(resume, dict) else None,
            attempt=int(doc.get("attempt", 0)) + 1,
            cancel=CancelFlag(),
            slot_tag=self.store.ks.slot_tag(run.task.execution_id),
        )
        started_s, began_s = self._clock(), time.monotonic()
        self._watch.add(ctx, run.task)
        try:
            attempt = await invoke(step.fn, ctx, offload=run.offload, thread_loop=self._thread_loop)
        finally:
            self._watch.remove(ctx)
        if attempt.raised is not None:  # any BaseException: a failed attempt (plaita/flows/invoke.py)
            self._step_finished(run, step, "failed", began_s)
            return await self._failed(run, step, ctx, attempt.raised, started_s)
        value = attempt.value
        self._step_finished(run, step, "suspended" if isinstance(value, Suspend) else "ok", began_s)
        before = run.snapshot()
        try:
            return await self._succeeded(run, step, ctx, value, started_s)
        except StepOutputError as exc:  # nothing was written: a failed attempt of the step
            run.restore(before)
            return await self._failed(run, step, ctx, exc, started_s)

    def _step_finished(self, run: Run, step: Step, outcome: str, began_s: float) -> None:
        if self.observer is not None:
            self.observer.step_finished(run.flow.flow_id, step.name, outcome, time.monotonic() - began_s)

    async def _succeeded(self, run: Run, step: Step, ctx: StepContext, value: Any, started_s: float) -> bool:
        doc, now_s = run.doc, self._clock()
        if isinstance(value, Suspend):
            return await self._suspended(run, step, ctx, value, started_s)
        if ctx.next_step is not None:
            index = run.flow.index_of(ctx.next_step)
            if index is None:
                return await self._fail_now(
                    run,
                    step,
                    "UnknownStep",
                    f"step {step.name!r} chose an unknown next step {ctx.next_step!r}",
                    ctx.attempt,
                )
        else:
            index = int(doc["step_index"]) + 1
        if isinstance(value, dict):
            ctx.state.update(value)
        doc.update(state=ctx.state, attempt=0, resume=None)
        doc.setdefault("results", {})[step.name] = value
        model.add_history(doc, model.history_entry(step.name, ctx.attempt, started_s, now_s, "ok"))
        if index >= len(run.flow.steps):
            doc.update(ended_at=now_s)
            await self._checkpoints.save(run, "completed", staged=ctx.staged, step=step)
            return True
        doc.update(step_index=index, step=run.flow.steps[index].name)
        await self._checkpoints.save(run, "running", staged=ctx.staged, step=step)
        return False

    async def _suspended(self, run: Run, step: Step, ctx: StepContext, value: Suspend, started_s: float) -> bool:
        doc, now_s = run.doc, self._clock()
        doc.update(state=ctx.state, attempt=0, resume=None)
        model.add_history(doc, model.history_entry(step.name, ctx.attempt, started_s, now_s, "suspended"))
        seq = int(doc.get("suspensions", 0)) + 1
        deadline_s = None if value.timeout_s is None else now_s + value.timeout_s
        doc["suspensions"] = seq
        if run.pending is not None:  # a resume arrived before this suspension: apply it now
            rtype, data, rid = run.pending
            run.pending = None
            model.apply_resume(doc, rtype, data, rid)
            await self._checkpoints.save(run, "running", staged=ctx.staged, step=step)
            return False
        doc["suspension"] = {"seq": seq, "step": step.name, "since": now_s, "deadline": deadline_s}
        await self._checkpoints.save(run, "suspended", staged=ctx.staged, deadline_s=deadline_s, step=step)
        return True

    async def _failed(self, run: Run, step: Step, ctx: StepContext, exc: BaseException, started_s: float) -> bool:
        if run.task.cancelled.is_set():
            raise LeaseLostError(f"lease of execution {run.task.execution_id} lost during step {step.name!r}")
        doc, now_s = run.doc, self._clock()
        policy, attempt = step.retry, ctx.attempt
        desc = model.describe_exception(exc)
        where = f"execution {ctx.execution_id}: step {step.name!r}"
        retryable = isinstance(exc, StepOutputError) or policy.retryable(exc)
        if not retryable or attempt >= policy.max_attempts:
            logger.warning("%s failed for good (attempt %d): %s", where, attempt, desc)
            model.add_history(doc, model.history_entry(step.name, attempt, started_s, now_s, "error", desc))
            doc.update(attempt=attempt, error=model.error_from_exception(step.name, exc, attempt), ended_at=now_s)
            await self._checkpoints.save(run, "error", step=step)
            return True
        delay_s = policy.delay_s(attempt, self._rng)
        logger.info(
            "%s failed (attempt %d of %d), retry in %.2f s: %s", where, attempt, policy.max_attempts, delay_s, desc
        )
        model.add_history(doc, model.history_entry(step.name, attempt, started_s, now_s, "failed", desc))
        doc["attempt"] = attempt  # durable: a worker killed during the retries does not reset the budget
        await self._checkpoints.save(run, "running", step=step)
        await self._pause(run, delay_s)
        return False

    async def _fail_now(self, run: Run, step: Step, kind: str, message: str, attempt: int) -> bool:
        logger.error("execution %s: %s", run.task.execution_id, message)
        now_s = self._clock()
        model.add_history(run.doc, model.history_entry(step.name, attempt, now_s, now_s, "error", message))
        run.doc.update(error=model.error_doc(step.name, kind, message), ended_at=now_s)
        await self._checkpoints.save(run, "error", step=step)
        return True

    async def _end(self, run: Run, status: str) -> None:
        run.doc["ended_at"] = self._clock()
        await self._checkpoints.save(run, status)

    async def _pause(self, run: Run, delay_s: float) -> None:
        """Wait ``delay_s`` between attempts; LeaseLostError as soon as the lease is lost."""
        cancelled = run.task.cancelled
        if not run.offload:
            lost = cancelled.wait(delay_s)
        else:
            deadline_s = time.monotonic() + delay_s
            while not cancelled.is_set() and (left_s := deadline_s - time.monotonic()) > 0:
                await asyncio.sleep(min(0.1, left_s))
            lost = cancelled.is_set()
        if lost:
            raise LeaseLostError(f"lease of execution {run.task.execution_id} lost while waiting to retry")
