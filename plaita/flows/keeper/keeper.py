"""The keeper: finds executions no worker will pick up again and enqueues what continues them.

- A ``running`` execution with no live lease and no task in the stream (its worker died and
  its task went to the DLQ, or was lost with a Redis that restarted without its data) gets a
  ``resume`` ``retry``, at most once per cooldown.
- A suspension past its deadline gets a ``resume`` ``timeout`` (carrying the suspension's
  number, so a late one cannot time out a later suspension); one past the whole execution's
  deadline (``deadline_at``, in the same index) gets a ``cancel`` instead.
- A running, unleased execution not updated for ``zombie_after_s`` is set to ``error``
  ("orphaned"): retrying it has not helped for that long. A child execution gets a task with
  it that wakes its parent, as any terminal child does (``plaita.flows.model.bodies.end_task``).

Every tenant's executions are kept (the tenants listed in ``plaita:tenants``, after the default
tenant's); a report names a tenant's execution ``<tenant>/<id>``.

Any number of keepers may run per queue: one acts at a time, holding the queue's keeper lease
(``plaita:keeper:lease`` for the default queue, ``keeper_lease_key``); a dry run reads only and
never touches that lease. The acting keeper starts the ticks of every schedule recorded for its
queue, its own flows' among them (``plaita.flows.keeper.scheduler``). A Redis failure never ends the
keeper: it backs off (``BackoffPolicy``) and tries again. Nothing in the data stops a pass: one
execution key that holds no execution, one tenant's index of another type, one bad schedule is
skipped, counted and logged once, and the rest of the pass goes on (docs/flows.md, "The keeper").
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from plaita.clock import wall_s
from plaita.flows.keeper.claims import DeadlineClaims
from plaita.flows.keeper.keeper_types import KeeperPass as KeeperPass
from plaita.flows.keeper.keeper_types import KeeperSettings as KeeperSettings
from plaita.flows.keeper.keeper_types import Skips, due_body, label, log_pass
from plaita.flows.keeper.scheduler import Scheduler
from plaita.flows.keeper_io import KeeperIO, KeeperTenantIO, UnreadableExecution, UnreadableIndex
from plaita.flows.model import bodies as model
from plaita.flows.model.bodies import end_task
from plaita.flows.model.execution import error_doc
from plaita.fsm import BackoffPolicy, ErrorKind

logger = logging.getLogger(__name__)

#: Longest wait for the keeper lease release when stopping.
HAND_OVER_S = 0.3
#: How often the keeper looks at the earliest deadline between passes (the wake latency of a sleep).
DEADLINE_POLL_S = 0.25


class Keeper:
    def __init__(
        self,
        io: KeeperIO,
        settings: KeeperSettings | None = None,
        *,
        scheduler: Scheduler,
        clock: Callable[[], float] = wall_s,
        on_orphaned: Callable[[str, str, float], None] | None = None,
    ) -> None:
        #: The keeper's one door to Redis (``plaita.flows.keeper_io``): built where the keeper is
        #: put together (``plaita.ops.keeper_build``), as its scheduler is.
        self.io = io
        #: Told (execution id, reason, last update) of each execution marked orphaned (alerts).
        self.on_orphaned = on_orphaned
        #: Told of every pass (its ``duration_s`` set) and of every full pass that failed: the
        #: standalone keeper's metrics and readiness. Must not block; an exception is logged only.
        self.on_pass: Callable[[KeeperPass], None] | None = None
        self.on_failure: Callable[[BaseException], None] | None = None
        #: Starts the ticks of every schedule recorded for the queue (and of the flows it was given).
        self.scheduler = scheduler
        self.settings = settings or KeeperSettings()
        self.holder = f"keeper:{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._clock = clock
        self._stop = threading.Event()
        #: Unreadable keys skipped: counted every time, logged once per key.
        self._skips = Skips()
        #: The stores of every tenant with executions (the default one first), as of the last pass.
        self._stores: list[KeeperTenantIO] = [io.for_tenant(None)]
        self._claims = DeadlineClaims(self.settings.timeout_cooldown_s)
        #: When the keeper lease was last taken or renewed, or tried (monotonic s): every third
        #: of its TTL, between passes too, so a pass longer than that does not lose it.
        self._lease_tried_at_s = -math.inf
        #: The stream's execution ids, as read by the current pass (None: not yet).
        self._in_stream: set[str] | None = None

    @property
    def corrupt_skips(self) -> int:
        """Unreadable keys (executions, a tenant's index, schedules) skipped, every time one was
        met (a counter for operators)."""
        return self._skips.count

    def request_stop(self) -> None:
        """Safe from any thread or a signal handler: the loop ends within about a second."""
        self._stop.set()
        self.io.interrupt()

    def run(self, *, once: bool = False) -> int:
        """Pass after pass until stopped; with ``once`` a single pass: exit 1 (one error line) if
        it failed or another keeper holds the lease. The lease is handed back on every exit."""
        try:
            return self._single() if once else self._loop()
        finally:
            if not self.settings.dry_run:  # a dry run never takes it: nothing to hand back
                self._hand_over()

    def _single(self) -> int:
        try:
            report = self.run_once()
        except Exception as exc:
            logger.error("keeper pass failed: %s: %s", type(exc).__name__, exc)
            self._tell(self.on_failure, exc)
            return 1
        if not report.acting:
            holder = self._lease_holder()
            logger.error("keeper: %s is held by %s; this pass did nothing", self.io.keeper_lease_key, holder)
            return 1
        self._passed(report)
        return 0

    def _lease_holder(self) -> str:
        try:
            return self.io.keeper_lease_holder() or "another keeper (expired since)"
        except Exception:  # the pass itself did not fail: do not make it fail now
            return "another keeper"

    def _loop(self) -> int:
        s = self.settings
        backoff = BackoffPolicy(base_s=s.backoff_base_s, cap_s=s.backoff_cap_s, persistent_s=s.persistent_backoff_s)
        failing_since: float | None = None
        while not self._stop.is_set():
            try:
                self._passed(self.run_once())
            except Exception as exc:
                if self._stop.is_set():
                    break
                self._tell(self.on_failure, exc)
                kind = self.io.failure_kind(exc)
                delay_s = backoff.schedule(persistent=kind is not ErrorKind.TRANSIENT)
                level = logging.WARNING if failing_since is None else logging.DEBUG
                failing_since = failing_since or time.monotonic()
                what = "Redis failed" if self.io.is_redis_failure(exc) else "pass failed"
                logger.log(level, "keeper: %s (%s: %s); retrying in %.2f s", what, type(exc).__name__, exc, delay_s)
                self._stop.wait(delay_s)
                continue
            if failing_since is not None:
                logger.info("keeper: Redis is back after %.1f s", time.monotonic() - failing_since)
                failing_since = None
            backoff.reset()
            self._until_next_pass(s.interval_s)
        return 0

    def _until_next_pass(self, interval_s: float) -> None:
        """Wait ``interval_s`` for the next full pass; meanwhile, every ``DEADLINE_POLL_S``, peek
        at the earliest deadline and, when one is due, run the deadline part of a pass at once:
        a sleep wakes (and a suspension times out) within about that of its deadline, where the
        full pass (which reads the stream) stays every ``interval_s``. A peek that fails leaves
        it to the next full pass, whose backoff handles an outage."""
        next_pass_s = time.monotonic() + interval_s
        while not self._stop.is_set() and (left_s := next_pass_s - time.monotonic()) > 0:
            self._stop.wait(min(DEADLINE_POLL_S, left_s))
            if self._stop.is_set() or self.settings.dry_run:
                continue
            try:
                if time.monotonic() - self._lease_tried_at_s >= self.settings.lease_ttl_s / 3:
                    self._hold_lease()  # renewed (or taken over) every third of its TTL
                earliest_s = self._earliest_deadline()
                if self._claims.pending() or (earliest_s is not None and earliest_s <= self._clock()):
                    self._passed(self.run_deadlines())
            except Exception as exc:
                logger.debug("keeper: deadline check failed (%s: %s)", type(exc).__name__, exc)
                return

    def _earliest_deadline(self) -> float | None:
        """The earliest deadline of every tenant whose deadlines index is readable."""
        found = []
        for store in self._stores:
            try:
                found.append(store.earliest_deadline())
            except UnreadableIndex:  # counted and logged by the passes, which skip it too
                continue
        return min((e for e in found if e is not None), default=None)

    def run_deadlines(self) -> KeeperPass:
        """The deadline part of a pass only (timeouts and wakes), under the keeper lease."""
        started_s = time.monotonic()
        if not self._hold_lease():
            return KeeperPass(acting=False, full=False, duration_s=time.monotonic() - started_s)
        report = KeeperPass(full=False)
        for store in self._stores:
            self._tenant_part(self._timeouts, store, self._clock(), report)
        report.duration_s = time.monotonic() - started_s
        return report

    def _hold_lease(self) -> bool:
        """Take or renew the keeper lease; True if this keeper holds it now."""
        self._lease_tried_at_s = time.monotonic()
        return self.io.hold_keeper_lease(self.holder, int(self.settings.lease_ttl_s * 1000))

    def _tenant_stores(self, report: KeeperPass | None = None) -> list[KeeperTenantIO]:
        """The default tenant's executions, then each tenant's with executions (``plaita:tenants``);
        the default tenant's alone when that set is not a set (counted in ``report``)."""
        try:
            tenants = self.io.keeper_tenants()
        except UnreadableIndex as bad:
            self._skips.index(bad, store=None, part="", report=report or KeeperPass())
            tenants = []
        return [self.io.for_tenant(None), *(self.io.for_tenant(t) for t in tenants)]

    def _tenant_part(
        self,
        part: Callable[[KeeperTenantIO, float, KeeperPass], None],
        store: KeeperTenantIO,
        now_s: float,
        report: KeeperPass,
    ) -> None:
        """One part of a pass for one tenant; an index of that tenant of another type skips that
        part for that tenant only."""
        try:
            part(store, now_s, report)
        except UnreadableIndex as bad:
            self._skips.index(bad, store, part.__name__, report)

    def _hand_over(self) -> None:
        """Release the keeper lease so another keeper acts at once; bounded (a frozen server
        must not delay the stop): past HAND_OVER_S the lease simply expires."""

        def release() -> None:
            try:
                self.io.release_keeper_lease(self.holder)
            except Exception as exc:  # Redis down: the lease expires by itself
                logger.debug("keeper lease not released: %s: %s", type(exc).__name__, exc)

        thread = threading.Thread(target=release, name="plaita-keeper-handover", daemon=True)
        thread.start()
        thread.join(HAND_OVER_S)

    log_pass = staticmethod(log_pass)

    def _passed(self, report: KeeperPass) -> None:
        self.log_pass(report)
        self._tell(self.on_pass, report)

    @staticmethod
    def _tell(hook: Callable[[Any], None] | None, what: object) -> None:
        """A metrics hook must never fail a pass (nor the keeper's loop)."""
        if hook is None:
            return
        try:
            hook(what)
        except Exception:
            logger.exception("keeper: a pass hook failed")

    def run_once(self) -> KeeperPass:
        """One pass. A dry run reads only: it neither takes nor waits for the keeper lease."""
        s, started_s = self.settings, time.monotonic()
        if not s.dry_run and not self._hold_lease():
            self.scheduler.refresh_records(self._clock())  # the acting keeper runs them
            return KeeperPass(acting=False, duration_s=time.monotonic() - started_s)
        report = KeeperPass()
        now_s = self._clock()
        self._stores = self._tenant_stores(report)
        for store in self._stores:
            self._tenant_part(self._timeouts, store, now_s, report)
        ticks = self.scheduler.run_pass(now_s, dry_run=s.dry_run)
        report.scheduled, report.corrupt = ticks.started, report.corrupt + ticks.corrupt
        self._skips.count += len(ticks.corrupt)  # the scheduler logged them
        self._in_stream = None  # read once per pass, by the first tenant that needs it
        for store in self._stores:
            self._tenant_part(self._orphans, store, now_s, report)
        report.duration_s = time.monotonic() - started_s
        return report

    def _timeouts(self, store: KeeperTenantIO, now_s: float, report: KeeperPass) -> None:
        s = self.settings
        if not s.dry_run:
            self._claims.retake(store)
        # The claim holds each due deadline for one keeper lease first, so a keeper killed before
        # its enqueue has the wake sent by its successor (which acts a lease later) rather than
        # never; an enqueue that fails takes the hold back at once. What was sent (or is
        # unreadable) waits the cooldown from then on.
        claim_at_s = now_s + min(s.lease_ttl_s, s.timeout_cooldown_s)
        due = store.due_deadlines(now_s, claim_at_s, s.batch, dry_run=s.dry_run)
        unsent = dict.fromkeys(due)  # in order; what the claim re-armed and nothing sent yet
        acted: list[str] = []  # sent or unreadable: re-armed for the cooldown at the end
        try:
            for eid, doc in zip(due, store.read_many(due), strict=True):
                if isinstance(doc, UnreadableExecution):
                    self._skips.execution(doc, report)
                    unsent.pop(eid)
                    acted.append(eid)  # a bad key is met once per cooldown, not per pass
                    continue
                suspension = doc.get("suspension") if doc else None
                if doc is None or doc.get("status") != "suspended" or not isinstance(suspension, dict):
                    if not s.dry_run:
                        store.forget_deadline(eid)
                    unsent.pop(eid)
                    continue
                body = due_body(store, eid, doc, suspension, now_s, report)
                if not s.dry_run:
                    self.io.enqueue(body)
                unsent.pop(eid)
                acted.append(eid)
        except Exception:
            if not s.dry_run:
                self._claims.take_back(store, list(unsent), claim_at_s, now_s)
                self._claims.cool_down(store, acted, claim_at_s, now_s, quiet=True)
            raise
        if not s.dry_run:
            self._claims.cool_down(store, acted, claim_at_s, now_s, quiet=False)

    def _orphans(self, store: KeeperTenantIO, now_s: float, report: KeeperPass) -> None:
        """One tenant's orphans; the stream's execution ids (``label``s) are read by the first
        tenant of the pass that needs them (``_in_stream``)."""
        s = self.settings
        unleased = self._unleased(store, now_s - s.orphan_grace_s, report)
        if not unleased or report.skipped_scan:
            return
        if self._in_stream is None:
            self._in_stream, complete = self.io.execution_ids(s.max_stream_scan)
            if not complete:
                logger.warning("keeper: stream longer than %d entries; orphan pass skipped", s.max_stream_scan)
                report.skipped_scan = True
                return
        in_stream = self._in_stream
        unqueued = [(eid, at) for eid, at in unleased if label(store, eid) not in in_stream]
        # Read again after the scan: an execution that moved on meanwhile is not an orphan.
        now_scores = store.still_running([eid for eid, _ in unqueued])
        for (eid, at), score in zip(unqueued, now_scores, strict=True):
            if score is None or score != at:
                continue
            if now_s - at > s.zombie_after_s:
                self._orphaned(store, eid, at, now_s, report)
            elif s.dry_run or store.mark_retry_sent(eid, int(s.retry_cooldown_s)):
                report.retries.append(label(store, eid))
                if not s.dry_run:
                    self._send_retry(store, eid)

    def _send_retry(self, store: KeeperTenantIO, eid: str) -> None:
        try:
            rid = f"keeper:{uuid.uuid4().hex[:12]}"
            self.io.enqueue(model.resume_body(eid, "retry", resume_id=rid, tenant_id=store.tenant))
        except Exception:
            # Not sent: take the cooldown mark back (best effort) so the next pass retries it.
            with contextlib.suppress(Exception):
                store.clear_retry_mark(eid)
            raise

    def _unleased(self, store: KeeperTenantIO, before_s: float, report: KeeperPass) -> list[tuple[str, float]]:
        """Running executions not updated since ``before_s`` whose lease is gone, page by page:
        long steps of live workers keep old scores, so the first page alone could hide every
        orphan behind them; so could unreadable keys (skipped here: no worker could run a
        retry of one, and they must not fill the batch)."""
        s = self.settings
        out: list[tuple[str, float]] = []
        for offset in range(0, s.max_candidates, s.batch):
            page = store.running_since(before_s, offset, s.batch)
            leased = store.leased([eid for eid, _ in page])
            candidates = [c for c, held in zip(page, leased, strict=True) if not held]
            for c, doc in zip(candidates, store.read_many([eid for eid, _ in candidates]), strict=True):
                if isinstance(doc, UnreadableExecution):
                    self._skips.execution(doc, report)
                else:
                    out.append(c)
            if len(page) < s.batch or len(out) >= s.batch:
                break
        return out

    def _orphaned(self, store: KeeperTenantIO, eid: str, updated_at_s: float, now_s: float, report: KeeperPass) -> None:
        s = self.settings
        message = f"orphaned: running with no worker and no task for {now_s - updated_at_s:.0f} s"
        # A child's parent is told through a task enqueued with the marking (``end_task``).
        error, tenant = error_doc(None, "Orphaned", message), store.tenant

        def follow_up(doc: dict[str, Any]) -> dict[str, Any] | None:
            return end_task(doc, tenant_id=tenant)

        if s.dry_run or store.mark_orphaned(eid, updated_at_s, error, now_s, s.retention_s, follow_up=follow_up):
            report.orphaned.append(label(store, eid))
            if not s.dry_run and self.on_orphaned is not None:
                try:
                    self.on_orphaned(label(store, eid), message, updated_at_s)
                except Exception:  # an alert must never fail a pass
                    logger.exception("keeper: orphan hook failed for %s", eid)
