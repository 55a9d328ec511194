"""Mixed fleets: which worker runs an execution, and handing a task to one that can.

During a rolling upgrade (or with two services sharing a queue) workers with different flow
definitions read the same stream. The rule (docs/flows.md, "Versions and rolling upgrades"):

* A worker runs an execution when its definition is the one that last checkpointed it (same
  fingerprint), or declares that version compatible (``compatible_with``) and has the current
  step; it then upgrades the execution to its own version.
* A worker that cannot (it does not load the flow; its definition is *older* than the one that
  last checkpointed the execution, i.e. its version is in the execution's ``versions``; it lacks
  the current step) never ends the execution. It hands the task back, without charging a
  delivery, when a live registered worker of its queue can run it, at most ``HANDOVER_LIMIT``
  times per task per ``HANDOVER_WINDOW_S``; otherwise (or past that) an older worker leaves it
  pending like a failed delivery, for a newer worker to reclaim.
* Only a worker that is not older, when no live worker can run the execution, ends it in
  ``error`` (an incompatible change deployed while executions of the old version were running);
  a task for a flow no live worker loads goes to the DLQ as before.

Workers publish what they run in the registry (``fleet_entry``, under ``runs``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, NoReturn

from plaita.errors import NotForThisWorker
from plaita.flows.io import ExecutionIO
from plaita.flows.model.definition import Flow
from plaita.tasks import Task

logger = logging.getLogger(__name__)

#: Hand-backs of one task within the window before it is left pending instead (anti ping-pong).
HANDOVER_LIMIT = 10
HANDOVER_WINDOW_S = 60.0
#: The n-th hand-back of a task within the window waits HANDOVER_DELAY_S * 2**(n-2), at most
#: HANDOVER_MAX_DELAY_S (the worker caps it below its lease TTL), with its slot free: an idle
#: worker keeps reading its own hand-back while the one that can run it is busy, and must not
#: spend the budget on that in milliseconds (nor hold a slot the other service's task needs).
HANDOVER_DELAY_S = 0.05
HANDOVER_MAX_DELAY_S = 2.0
#: The registry is read at most this often (a hand-back storm must not SCAN per task).
FLEET_CACHE_S = 1.0
#: Registry statuses of workers that read new tasks.
READING_STATUSES = ("starting", "running")


def flow_entry(flow: Flow) -> dict[str, Any]:
    """What a worker publishes about one flow it runs."""
    return {
        "flow_id": flow.flow_id,
        "version": flow.version,
        "compatible_with": list(flow.compatible_with),
        "fingerprint": flow.fingerprint,
        "steps": flow.step_names,
    }


def fleet_entry(flows: Iterable[Flow]) -> dict[str, Any]:
    """The registry's ``runs`` of a flow worker."""
    return {"flows": [flow_entry(f) for f in flows]}


def superseded(flow: Flow, doc: dict[str, Any]) -> bool:
    """True when ``doc`` was last checkpointed by a newer definition than ``flow`` (this worker
    is the old one of a rolling upgrade): ``flow``'s version is in the execution's lineage."""
    versions = doc.get("versions")
    return (
        flow.version is not None
        and doc.get("version") != flow.version
        and isinstance(versions, list)
        and flow.version in versions
    )


def can_run(published: dict[str, Any], doc: dict[str, Any]) -> bool:
    """True when a published flow definition (``flow_entry``) can continue ``doc``."""
    if published.get("fingerprint") == doc.get("fingerprint"):
        return True
    version, wanted = published.get("version"), doc.get("version")
    compatible = published.get("compatible_with") or []
    steps = published.get("steps") or []
    accepts = version is not None and wanted is not None and (wanted == version or wanted in compatible)
    return accepts and doc.get("step") in steps


def task_name(task: Task) -> str:
    """What the hand-over counter is keyed by: the execution, or the body itself (a start without
    an ``execution_id`` gets a new message id at every re-add)."""
    eid = task.body.get("execution_id")
    if isinstance(eid, str) and eid:
        return eid
    return hashlib.sha1(json.dumps(task.body, sort_keys=True).encode("utf-8")).hexdigest()


class Handover:
    """Finds live workers of this queue that can run a task, and hands tasks over to them."""

    def __init__(self, queue: str, *, group: str | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.queue = queue
        self.group = group
        self._clock = clock
        self._lock = threading.Lock()
        self._cached: tuple[float, list[tuple[str, dict[str, Any]]]] | None = None

    @staticmethod
    def entry(flows: Iterable[Flow]) -> dict[str, Any]:
        """What a worker running ``flows`` publishes for the others (``fleet_entry``)."""
        return fleet_entry(flows)

    async def published(self, io: ExecutionIO) -> list[tuple[str, dict[str, Any]]]:
        """(instance id, flow entry) for every flow a live worker of this queue publishes (the
        registry read through ``io``, cached ``FLEET_CACHE_S``)."""
        now = self._clock()
        with self._lock:
            if self._cached is not None and now - self._cached[0] < FLEET_CACHE_S:
                return self._cached[1]
        out: list[tuple[str, dict[str, Any]]] = []
        for w in await io.fleet_workers():
            if w.get("stream") != self.queue or w.get("status") not in READING_STATUSES:
                continue
            if self.group is not None and w.get("group") != self.group:
                continue
            runs = w.get("runs")
            flows = runs.get("flows") if isinstance(runs, dict) else None
            for f in flows if isinstance(flows, list) else []:
                if isinstance(f, dict):
                    out.append((str(w.get("instance_id")), f))
        with self._lock:
            self._cached = (now, out)
        return out

    # -- the cases (each raises NotForThisWorker, or returns: the caller does what it did) -----
    async def unknown_flow(self, io: ExecutionIO, task: Task, flow_id: Any) -> None:
        """A task for a flow this worker does not load: hand it to a live worker that does."""
        takers = [i for i, f in await self.published(io) if f.get("flow_id") == flow_id]
        if takers:
            await self._hand_over(io, task, f"flow {flow_id!r} is not loaded here", takers)

    async def requested_version(self, io: ExecutionIO, task: Task, flow_id: str, version: str) -> None:
        """A start asking for a version this worker does not run: hand it to one that does."""
        takers = [
            i
            for i, f in await self.published(io)
            if f.get("flow_id") == flow_id and version in (f.get("version"), *(f.get("compatible_with") or []))
        ]
        if takers:
            await self._hand_over(io, task, f"flow {flow_id!r} version {version!r} is not run here", takers)

    async def cannot_continue(self, io: ExecutionIO, task: Task, flow: Flow, doc: dict[str, Any]) -> None:
        """This definition cannot continue ``doc``: hand it to a live worker that can; an older
        worker leaves it pending even when none is live (it must never end it)."""
        what = (
            f"execution of flow {flow.flow_id!r} is at version {doc.get('version')!r} (step {doc.get('step')!r}); "
            f"this worker runs version {flow.version!r}"
        )
        takers = [i for i, f in await self.published(io) if f.get("flow_id") == flow.flow_id and can_run(f, doc)]
        if takers:
            await self._hand_over(io, task, what, takers)
        if superseded(flow, doc):
            logger.warning("execution %s: %s, which is older, and no live worker runs it", task.execution_id, what)
            raise NotForThisWorker(f"{what}: no live worker runs it", hand_back=False)

    async def _hand_over(self, io: ExecutionIO, task: Task, what: str, takers: list[str]) -> NoReturn:
        name = task_name(task)
        n = await io.count_handover(name, HANDOVER_WINDOW_S)
        reason = f"{what}; left for {', '.join(sorted(set(takers))[:3])}"
        if n > HANDOVER_LIMIT:
            logger.warning(
                "task %s (%s): handed back %d times in %.0f s without reaching a worker that runs it: %s",
                task.message_id,
                name,
                HANDOVER_LIMIT,
                HANDOVER_WINDOW_S,
                reason,
            )
            raise NotForThisWorker(reason, hand_back=False)
        logger.info(
            "task %s (%s): %s: handed back (%d of %d in %.0f s)",
            task.message_id,
            name,
            reason,
            n,
            HANDOVER_LIMIT,
            HANDOVER_WINDOW_S,
        )
        delay_s = 0.0 if n == 1 else min(HANDOVER_MAX_DELAY_S, HANDOVER_DELAY_S * 2 ** (n - 2))
        raise NotForThisWorker(reason, delay_s=delay_s)
