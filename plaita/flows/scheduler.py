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

See ``plaita.flows.schedules`` for the missed-ticks policies.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from plaita.errors import ConfigError
from plaita.flows.client import FlowClient
from plaita.flows.definition import Flow
from plaita.flows.schedules import Plan, Schedule, execution_id_of, schedule_of
from plaita.store.executions import ExecutionStore, UnreadableExecution
from plaita.store.schedule_store import ScheduleStore, UnreadableSchedule
from plaita.store.streams import StreamQueue

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
    #: Schedule keys that are not hashes, skipped.
    corrupt: list[str] = field(default_factory=list)


def scheduled_flows(flows: Iterable[Flow]) -> list[tuple[str, Schedule]]:
    out = []
    for f in flows:
        schedule = schedule_of(f.schedule)
        if schedule is not None:
            out.append((f.flow_id, schedule))
    return out


class Scheduler:
    """Starts the scheduled flows' ticks on ``queue``; ``run_pass(now_s)`` is one pass."""

    def __init__(
        self,
        flows: Iterable[Flow],
        queue: StreamQueue,
        *,
        store: ExecutionStore | None = None,
        pending_stale_s: float = PENDING_STALE_S,
    ) -> None:
        self.schedules = scheduled_flows(flows)
        self.producer = FlowClient(queue, store)
        self.store = ScheduleStore(queue.client)
        self.pending_stale_s = pending_stale_s
        self._described: set[str] = set()
        self._logged_bad: set[str] = set()

    def __bool__(self) -> bool:
        return bool(self.schedules)

    def run_pass(self, now_s: float, *, dry_run: bool = False) -> SchedulePass:
        report = SchedulePass()
        for flow_id, schedule in self.schedules:
            try:
                record = self.store.read(flow_id)
            except UnreadableSchedule as bad:
                report.corrupt.append(bad.key)
                if bad.key not in self._logged_bad:
                    self._logged_bad.add(bad.key)
                    logger.warning("keeper: %s; schedule of %s skipped (left for an operator)", bad, flow_id)
                continue
            if not dry_run and flow_id not in self._described:
                self.store.describe(flow_id, schedule.describe())
                self._described.add(flow_id)
            self._one(flow_id, schedule, record, now_s, report, dry_run=dry_run)
        return report

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


def schedule_rows(flows: Iterable[Flow], executions: ExecutionStore, now_s: float) -> list[dict[str, Any]]:
    """One row per schedule (``plaita schedules list``): the given flows' and every one a
    keeper recorded (``plaita:schedules``), with its next tick and its newest execution. Reads only."""
    store = ScheduleStore(executions.client)
    defined = dict(scheduled_flows(flows))
    names = sorted({*defined, *store.known()})
    rows = []
    for flow_id, record in zip(names, store.read_many(names), strict=True):
        if isinstance(record, UnreadableSchedule):
            rows.append({"flow": flow_id, "error": str(record)})
            continue
        rows.append(_row(flow_id, defined.get(flow_id), record, executions, now_s))
    return rows


def _row(
    flow_id: str, schedule: Schedule | None, record: dict[str, str], executions: ExecutionStore, now_s: float
) -> dict[str, Any]:
    if schedule is None:  # known only from what a keeper recorded
        try:
            schedule = Schedule(record.get("cron", ""), tz=record.get("tz", "UTC"), missed=record.get("missed", "skip"))
        except ConfigError as exc:
            return {"flow": flow_id, "error": f"recorded schedule unusable: {exc}"}
    last_id = record.get("last_execution_id") or None
    try:
        doc = executions.get(last_id) if last_id else None
    except UnreadableExecution:
        doc = {"status": "unreadable"}
    return {
        "flow": flow_id,
        **schedule.describe(),
        "next_tick_s": schedule.next_tick_s(now_s),
        "last_tick_s": int(record["last_tick_s"]) if record.get("last_tick_s", "").isdigit() else None,
        "last_execution_id": last_id,
        "last_status": doc.get("status") if doc else ("expired" if last_id else None),
        "pending": bool(record.get("pending")),
        "recorded": bool(record),
    }
