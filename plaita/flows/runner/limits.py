"""Fleet-wide limits of a flow: ``Flow(max_concurrent=N, max_starts_per_s=R, rate_limit=(N, period_s))``.

A task of a limited flow takes a slot (``plaita.store.executions.flow_limits``: one atomic script over the
flow's own keys) before its first step runs and gives it back when its handler returns: the
execution suspended, ended, failed a delivery or lost its lease. A start is checked before its
execution is created, and a start also passes the flow's start rates; a resume is checked once
admission found it has work to do (a duplicate or a stale wake waits for nothing).

A start that finds every slot held is **parked**: the same script records it in the flow's queue
of parked starts (ordered by its stream id) with its task body, and its handler returns, so its
entry is acked and never re-read. Whoever frees a slot (a release, an acquire that prunes an
expired slot, or the sweep each worker runs every ttl/3) reserves it for the oldest parked start
and puts that start back on its stream; its task takes the reserved slot. So starts run in the
order they were started, per flow. The sweep also puts back (without a slot) a parked start whose
deadline passed, so it ends ``cancelled`` without waiting for its turn. Crash windows, each safe
under kill -9:

- parked, then killed before the ack: the entry is redelivered, finds itself parked (or its slot
  reserved) and parks again (a no-op) or runs; the parked entry is kept until a task of the start
  takes its slot, so it is never lost;
- promoted, then killed before the XADD: the reservation expires within the ttl and the start,
  still parked, is promoted again by the next script or sweep;
- promoted and re-added twice (a reservation that expired while its task sat in a long queue):
  the second copy is a duplicate start, idempotent on the execution id: nothing runs twice.

A start whose execution is already cancelled (its cancel flag set while it waited) or past its
deadline takes no slot and waits for none (``FlowLimits.passed``): it leaves the parked starts, is
created and ends ``cancelled`` without a step, so a cancel lands on a start waiting for a slot as
on any other queued start (``plaita.flows.producer.cancel`` puts a parked start back on its stream).

``max_concurrent_per_key`` works the same way per concurrency key (``Flow.key_of`` the params): the
key's own slots and parked starts (still in the flow's hash tag), so a busy key parks only its own
starts; the sweep also visits the keys with parked starts (at most SWEEP_KEYS_MAX a round, picked
at random: one script call each). The limits in force are the flow's run-time record where it has
one (``plaita limits set``, ``plaita.store.executions.limit_overrides``): the scripts read it.

A resume over the limit, and a start over a start rate, is handed back to the queue
(``NotForThisWorker``: no delivery is charged, it never reaches the DLQ) after a bounded, growing
wait (or the rate's own wait), with its handler slot free meanwhile. The slots held here are
renewed every ttl/3 by one thread; a worker that dies holds its slots at most one ttl (the lease
ttl) longer.
"""

from __future__ import annotations

import logging
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from plaita.errors import BadTaskError, NotForThisWorker
from plaita.flows.io import ExecutionIO
from plaita.flows.model.definition import Flow
from plaita.flows.model.validate import task_deadline
from plaita.flows.runner.handover import task_name
from plaita.store.executions.flow_limits import FULL, PARKED, TAKEN, Admit, FlowLimitStore, member_of, order_of
from plaita.tasks import Task

logger = logging.getLogger(__name__)

#: The n-th refusal of one execution in a row waits WAIT_BASE_S * 2**(n-1), at most WAIT_MAX_S
#: (the worker caps a hand-back's wait below its lease ttl too): quick when slots turn over fast,
#: a few round trips a second per waiting task at worst, never a busy loop.
WAIT_BASE_S = 0.05
WAIT_MAX_S = 2.0
#: Refusal counts remembered per runner before they are forgotten (a bound, not a policy).
_MAX_REMEMBERED = 10_000


@dataclass(frozen=True)
class Held:
    """A slot this worker holds: the flow, the execution and the token it was taken with."""

    flow_id: str
    execution_id: str
    token: str
    #: The flow's ``max_concurrent`` (or per key): a release gives the freed slot to a parked start.
    limit: int
    #: The concurrency key whose slot it is (None: the flow's own).
    key: str | None = None


class FlowLimits:
    """Takes, renews and gives back the slots of the tasks running in one runner; parks starts
    and sweeps the parked starts of ``flows`` (those with ``max_concurrent``)."""

    def __init__(
        self,
        store: FlowLimitStore,
        flows: Iterable[Flow] = (),
        *,
        ttl_s: float,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.ttl_s = ttl_s
        self._clock = clock
        #: Flows whose parked starts this runner sweeps, and how many wait in each (last sweep).
        self._parking = [f for f in flows if _slots_of(f)]
        self.waiting: dict[str, int] = {}
        self._registered: set[str] = set()
        self._rng = rng or random.Random()
        self._lock = threading.Lock()
        #: By task (``id(task)``): a task holds at most one slot, taken once.
        self._held: dict[int, Held] = {}
        self._refusals: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if self._parking:  # parked starts move on even when no task of their flow comes
            with self._lock:
                self._start_renewing()

    # -- one task -------------------------------------------------------------------------
    @staticmethod
    def limited(flow: Flow, *, start: bool) -> bool:
        """True when a task of ``flow`` (a start, or not) has a limit to pass (the model's answer)."""
        return flow.limited(start=start)

    async def passed(self, io: ExecutionIO, flow: Flow, task: Task, *, start: bool, params: Any = None) -> bool:
        """The runner's check, through its door: True to run, False for a start parked (its task
        ends here). NotForThisWorker over a start rate, or for a resume over the limit. A start
        that will end ``cancelled`` anyway passes at once, leaving the parked starts. ``params``:
        a resume's execution's (a start's are in its body), for a concurrency key."""
        if start and await self._start_cancelled(io, task):
            await self.forget(io, flow, task)
            return True
        return await self.enter(io, flow, task, start=start, params=params)

    async def _start_cancelled(self, io: ExecutionIO, task: Task) -> bool:
        """Whether ``task``'s start is past its deadline, or its cancel flag is set (one GET)."""
        try:
            deadline_at = task_deadline(task.body)
        except BadTaskError:  # its admission reports it (the DLQ)
            return False
        if deadline_at is not None and self._clock() >= deadline_at:
            return True
        return await io.cancel_requested(task)

    def holds(self, task: Task) -> bool:
        """True while ``task`` holds a slot (``leave`` gives it back)."""
        with self._lock:
            return id(task) in self._held

    async def enter(self, io: ExecutionIO, flow: Flow, task: Task, *, start: bool, params: Any = None) -> bool:
        """Take ``flow``'s slot (and, for a start, pass its start rates) for ``task``; returns at
        once for an unlimited flow. False: a start parked (its task is done here, acked). Raises
        NotForThisWorker (a delayed hand-back) when refused otherwise."""
        if not self.limited(flow, start=start):
            return True
        limit, token, member = _slots_of(flow), uuid.uuid4().hex, slot_member(task)
        key = _key_of(flow, task, params)
        admit = await self._acquire(io, flow, task, member, token, start=start, key=key)
        name = task_name(task)
        if admit.code not in (TAKEN, PARKED):
            raise self._refused(flow, task, admit)
        with self._lock:
            self._refusals.pop(name, None)
            if admit.code == TAKEN and limit:
                self._held[id(task)] = Held(flow.flow_id, member, token, limit, key)
                self._start_renewing()
        if admit.code == PARKED:
            logger.debug("start %s (execution %s) of flow %r parked for a slot", task.message_id, name, flow.flow_id)
        return admit.code == TAKEN

    async def _acquire(
        self, io: ExecutionIO, flow: Flow, task: Task, member: str, token: str, *, start: bool, key: str | None
    ) -> Admit:
        limit = _slots_of(flow)
        park = None
        if start and limit:  # a start finding every slot held parks, its body kept to re-add it
            body = {**task.body, "execution_id": task.execution_id}
            park = (order_of(task.message_id), body, _deadline(task))
            await self._register(io, flow.flow_id)
        return await io.acquire_flow_slot(
            flow.flow_id,
            member,
            token,
            max_concurrent=limit,
            ttl_s=self.ttl_s,
            starts_per_s=flow.max_starts_per_s if start and flow.max_starts_per_s else 0.0,
            burst=flow.start_burst,
            window=flow.rate_limit if start else None,
            park=park,
            key=key,
        )

    def _refused(self, flow: Flow, task: Task, admit: Admit) -> NotForThisWorker:
        """The delayed hand-back of a task over a limit (a resume over the slots, a start over a rate)."""
        name = task_name(task)
        delay_s = self._delay(name, admit.wait_s)
        if admit.code == FULL:
            what = f"every slot of flow {flow.flow_id!r} is taken"
        else:
            what = f"flow {flow.flow_id!r} is at its start rate"
        logger.debug("task %s (execution %s): %s; back to the queue in %.2f s", task.message_id, name, what, delay_s)
        return NotForThisWorker(what, delay_s=delay_s)

    async def _register(self, io: ExecutionIO, flow_id: str) -> None:
        """Once per process and flow, before its first park: the index a cancel looks in."""
        if flow_id not in self._registered:
            await io.register_parking(flow_id)
            self._registered.add(flow_id)

    async def forget(self, io: ExecutionIO, flow: Flow, task: Task) -> None:
        """``task``'s start waits no more (it ends cancelled): drop it from the parked starts."""
        if limit := _slots_of(flow):
            try:
                key = _key_of(flow, task, None)
            except BadTaskError:  # no key: it never parked, and it ends cancelled all the same
                return
            await io.forget_parked_start(
                flow.flow_id, slot_member(task), max_concurrent=limit, ttl_s=self.ttl_s, key=key
            )

    async def leave(self, io: ExecutionIO, task: Task) -> None:
        """Give back ``task``'s slot, if it holds one. Never raises: a slot that cannot be given
        back now (Redis unreachable) expires within the ttl."""
        with self._lock:
            held = self._held.pop(id(task), None)
        if held is None:
            return
        try:
            await io.release_flow_slot(
                held.flow_id, held.execution_id, held.token, max_concurrent=held.limit, ttl_s=self.ttl_s, key=held.key
            )
        except Exception as exc:
            logger.warning(
                "could not give back the slot of execution %s (flow %r): %s: %s; it expires within %.0f s",
                held.execution_id,
                held.flow_id,
                type(exc).__name__,
                exc,
                self.ttl_s,
            )

    def _delay(self, name: str, wait_s: float) -> float:
        with self._lock:
            if len(self._refusals) >= _MAX_REMEMBERED:
                self._refusals.clear()
            n = self._refusals[name] = self._refusals.get(name, 0) + 1
        backoff_s = min(WAIT_MAX_S, WAIT_BASE_S * float(2 ** min(n - 1, 16)))
        # Jitter spreads the waiters out, so a freed slot or a new token is not raced by all at once.
        return min(WAIT_MAX_S, max(wait_s, backoff_s) * (1.0 + self._rng.random()))

    # -- renewal ----------------------------------------------------------------------------
    def _start_renewing(self) -> None:
        """Start the renewer thread once (lock held)."""
        if self._thread is None and not self._stop.is_set():
            self._thread = threading.Thread(target=self._run, name="plaita-flow-limits", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(max(0.05, self.ttl_s / 3)):
            try:
                self.renew_once()
            except Exception as exc:  # Redis unreachable: next round (a slot lives a whole ttl)
                logger.debug("renewing flow slots failed (%s: %s); retrying", type(exc).__name__, exc)
            self.sweep_once()

    def sweep_once(self) -> None:
        """Give each parking flow's free slots to its oldest parked starts: a slot that expired
        (its holder died) and a reservation whose start never came back free no slot otherwise
        when the flow has no other traffic. Records how many starts wait (``waiting``)."""
        for flow in self._parking:
            try:
                n = self.store.promote(flow.flow_id, max_concurrent=flow.max_concurrent or 0, ttl_s=self.ttl_s)
                if flow.max_concurrent_per_key:
                    self._sweep_keys(flow.flow_id, flow.max_concurrent_per_key)
            except Exception as exc:  # Redis unreachable, or one flow's key of a wrong type: the next round
                logger.debug("sweeping parked starts of flow %r failed (%s: %s)", flow.flow_id, type(exc).__name__, exc)
                continue
            with self._lock:
                self.waiting[flow.flow_id] = n

    def _sweep_keys(self, flow_id: str, per_key: int) -> None:
        """The sweep of ``flow_id``'s concurrency keys with parked starts (a bounded pick)."""
        for scope in self.store.parked_keys(flow_id):
            self.store.promote_scope(flow_id, scope, max_concurrent=per_key, ttl_s=self.ttl_s)

    def renew_once(self) -> None:
        with self._lock:
            held = list(self._held.values())
        results = self.store.renew([(h.flow_id, h.execution_id, h.token, h.key) for h in held], self.ttl_s)
        for h, ok in zip(held, results, strict=True):
            if not ok and self._forget(h):
                logger.warning(
                    "the slot of execution %s (flow %r) expired while it ran (Redis unreachable for %.0f s?): "
                    "the flow may run over its limit until it ends",
                    h.execution_id,
                    h.flow_id,
                    self.ttl_s,
                )

    def _forget(self, held: Held) -> bool:
        """Stop renewing a lost slot (there is nothing left to give back); False if its task had
        given it back meanwhile."""
        with self._lock:
            for key, h in self._held.items():
                if h is held:
                    del self._held[key]
                    return True
            return False

    def close(self) -> None:
        self._stop.set()


def _slots_of(flow: Flow) -> int:
    """The slots a task of ``flow`` takes from: ``max_concurrent`` or per key; 0 = none."""
    return flow.max_concurrent or flow.max_concurrent_per_key or 0


def _key_of(flow: Flow, task: Task, params: Any) -> str | None:
    """The concurrency key of ``task`` (BadTaskError: none in its params); None without one."""
    if not flow.max_concurrent_per_key:
        return None
    return flow.key_of(task.body.get("params") if params is None else params)


def _deadline(task: Task) -> float | None:
    """The start's ``deadline_at`` (a bad one is its admission's to report: none here)."""
    try:
        return task_deadline(task.body)
    except BadTaskError:
        return None


def slot_member(task: Task) -> str:
    """The name of ``task``'s execution in its flow's slot set, unique across tenants (the slots
    are fleet-wide, not per tenant): the id for the default tenant, ``<tenant>\\x1f<id>`` for
    another (a tenant id starts with a letter or digit and has no control character, so the two
    forms cannot meet; a default-tenant id holding the separator is itself prefixed with it)."""
    return member_of(task.tenant_id, task.execution_id)
