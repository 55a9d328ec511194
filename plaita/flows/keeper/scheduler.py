"""The keeper's schedule pass: start one execution per due tick of every scheduled flow.

Correct whatever number of keepers run, with or without the keeper lease:

1. A tick's execution id and dedup key are ``schedule:{flow}:{tick_s}`` (``execution_id_of``):
   the same on every keeper, so a start enqueued twice makes one execution (the second start
   is a no-op at the worker).
2. Ticks are claimed by a compare-and-set of the schedule's newest tick (``plaita:schedule:{flow}``):
   of keepers passing at once one claims a tick, the others see it moved and start nothing.
3. The claimed ticks stay ``pending`` until their starts are enqueued. A keeper that dies in
   between leaves them there; a pass that finds them older than ``pending_stale_s`` enqueues
   them again (rule 1 makes that safe) and only then claims newer ticks.

The schedules a pass runs are its own flows' and every fresh one recorded for the queue
(``plaita.flows.keeper.schedule_records``). Each is isolated: one that cannot be stepped, a record that
cannot be read back, a schedule key of another type is skipped (one error line per schedule and
process, counted in ``SchedulePass.corrupt``) and the others run; only a Redis failure ends the
pass. See ``plaita.flows.model.schedules`` for the missed-ticks policies.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from plaita.flows.keeper.schedule_records import RECORD_TTL_S, FleetSchedules, scheduled_flows
from plaita.flows.keeper_io import PAUSED_FIELD, KeeperIO, Starter, UnreadableIndex, UnreadableSchedule
from plaita.flows.model.definition import Flow
from plaita.flows.model.schedules import Plan, Schedule, execution_id_of

logger = logging.getLogger(__name__)

#: Claimed ticks not confirmed enqueued after this are enqueued again by the next pass (an
#: enqueue takes milliseconds; a keeper still at it meanwhile only adds no-op duplicates).
PENDING_STALE_S = 10.0


@dataclass
class SchedulePass:
    """What one schedule pass started (or, dry run, would start)."""

    #: Execution ids of the ticks started, in order.
    started: list[str] = field(default_factory=list)
    #: Due ticks the missed-ticks policy did not start.
    dropped: int = 0
    #: Schedules skipped: keys of another type, records unusable, schedules that cannot be stepped.
    corrupt: list[str] = field(default_factory=list)


__all__ = ["SchedulePass", "Scheduler", "scheduled_flows"]


class Scheduler:
    """Starts the scheduled flows' ticks on the queue of ``io`` through ``starter``;
    ``run_pass(now_s)`` is one pass."""

    def __init__(
        self,
        flows: Iterable[Flow],
        io: KeeperIO,
        starter: Starter,
        *,
        pending_stale_s: float = PENDING_STALE_S,
        record_ttl_s: float = RECORD_TTL_S,
    ) -> None:
        #: The schedules of the flows this keeper loads (it records them for its queue).
        self.schedules = scheduled_flows(flows)
        #: How a tick's execution starts (``FlowClient.start``, given where the keeper is put together).
        self.producer = starter
        #: The schedules' bookkeeping hashes (the claim of ticks, their confirmation).
        self.store = io.schedules
        self.fleet = FleetSchedules(self.schedules, io.schedule_records, ttl_s=record_ttl_s)
        self._is_redis_failure = io.is_redis_failure
        self.pending_stale_s = pending_stale_s
        #: The definition last written to each schedule's bookkeeping hash (for listing).
        self._described: dict[str, dict[str, Any]] = {}
        self._logged_bad: set[tuple[str, str]] = set()

    def run_pass(self, now_s: float, *, dry_run: bool = False) -> SchedulePass:
        """Every schedule's due ticks; a Redis failure raises (the keeper backs off), any other
        failure of one schedule skips that one."""
        report = SchedulePass()
        schedules, unusable = self.fleet.current(now_s, dry_run=dry_run)
        for item, why in unusable:
            self._skip(item, why, report)
        for flow_id, schedule in schedules:
            try:
                self._schedule(flow_id, schedule, now_s, report, dry_run=dry_run)
            except (UnreadableSchedule, UnreadableIndex) as bad:
                self._skip(bad.key, f"{bad}; schedule of {flow_id} skipped", report)
            except Exception as exc:
                if self._is_redis_failure(exc):
                    raise
                why = f"schedule of {flow_id} ({schedule.cron!r}, tz {schedule.tz}) failed: {type(exc).__name__}: {exc}"
                self._skip(self.store.key(flow_id), why, report)
        return report

    def refresh_records(self, now_s: float) -> None:
        """On standby: record this keeper's own schedules (when due) for the acting keeper."""
        self.fleet.refresh_own(now_s)

    def _skip(self, item: str, why: str, report: SchedulePass) -> None:
        """Count it every pass; one error line per schedule (and reason) per process."""
        report.corrupt.append(item)
        if (item, why) not in self._logged_bad:
            self._logged_bad.add((item, why))
            logger.error("keeper: %s; skipped (left for an operator, logged once)", why)

    def _schedule(self, flow_id: str, schedule: Schedule, now_s: float, report: SchedulePass, *, dry_run: bool) -> None:
        record = self.store.read(flow_id)
        definition = schedule.describe()
        if not dry_run and (self._described.get(flow_id) != definition or not record):
            self.store.describe(flow_id, definition)  # again after a data loss (the hash is gone)
            self._described[flow_id] = definition
        self._one(flow_id, schedule, record, now_s, report, dry_run=dry_run)

    def _one(
        self,
        flow_id: str,
        schedule: Schedule,
        record: dict[str, str],
        now_s: float,
        report: SchedulePass,
        *,
        dry_run: bool,
    ) -> None:
        pending = record.get("pending")
        if pending is not None:
            self._pending_again(flow_id, schedule, record, pending, now_s, report, dry_run=dry_run)
            return
        seen = record.get("last_tick_s", "")
        plan = schedule.plan(int(seen) if seen.isdigit() else None, now_s)
        if plan.newest_s is None:
            return
        if record.get(PAUSED_FIELD):  # paused (plaita.flows.schedule_control): its ticks pass, none starts
            if dry_run or self.store.claim(flow_id, seen, plan.newest_s, "", repr(now_s)):
                report.dropped += len(plan.ticks) + plan.dropped
            return
        if dry_run:
            report.started += [execution_id_of(flow_id, t) for t in plan.ticks]
            report.dropped += plan.dropped
            return
        at = repr(now_s)
        body = _pending_text(plan)
        if not self.store.claim(flow_id, seen, plan.newest_s, body, at):
            return  # another keeper claimed these ticks first
        report.dropped += plan.dropped
        if plan.dropped:
            logger.info(
                "keeper: schedule %s: %s%d missed tick(s) not started (missed=%s)",
                flow_id,
                "at least " if plan.more else "",
                plan.dropped,
                schedule.missed,
            )
        if plan.ticks:
            self._start(flow_id, schedule, plan.ticks, plan.dropped, report)
            self._confirm(flow_id, plan.ticks, body, at)

    def _pending_again(
        self,
        flow_id: str,
        schedule: Schedule,
        record: dict[str, str],
        pending: str,
        now_s: float,
        report: SchedulePass,
        *,
        dry_run: bool,
    ) -> None:
        """Ticks claimed and never confirmed: enqueue them again once the claim is stale (their
        execution ids are fixed, so a start that did land is not started twice)."""
        if dry_run or now_s - _float(record.get("pending_at_s")) < self.pending_stale_s:
            return  # another keeper is enqueuing them now
        ticks, missed = _pending(pending)
        logger.warning("keeper: schedule %s: %d claimed tick(s) never confirmed; enqueued again", flow_id, len(ticks))
        self._start(flow_id, schedule, ticks, missed, report)
        self._confirm(flow_id, ticks, pending, record.get("pending_at_s", ""))

    def _start(self, flow_id: str, schedule: Schedule, ticks: list[int], missed: int, report: SchedulePass) -> None:
        for tick in ticks:
            eid = execution_id_of(flow_id, tick)
            self.producer.start(flow_id, schedule.tick_params(tick, missed), execution_id=eid, dedup_key=eid)
            report.started.append(eid)

    def _confirm(self, flow_id: str, ticks: list[int], pending: str, pending_at: str) -> None:
        newest = max(ticks, default=0)
        eid = execution_id_of(flow_id, newest) if ticks else ""
        self.store.confirm(flow_id, pending, pending_at, eid, newest)


def _pending_text(plan: Plan) -> str:
    return json.dumps({"ticks": plan.ticks, "missed": plan.dropped}) if plan.ticks else ""


def _pending(text: str) -> tuple[list[int], int]:
    """The ticks and missed count of a ``pending`` field; nothing for one plaita did not write."""
    try:
        doc: Any = json.loads(text)
        ticks = [int(t) for t in doc["ticks"]]
        return ticks, int(doc.get("missed", 0))
    except (ValueError, TypeError, KeyError, AttributeError):
        return [], 0


def _float(text: str | None) -> float:
    try:
        return float(text) if text is not None else 0.0
    except ValueError:
        return 0.0
