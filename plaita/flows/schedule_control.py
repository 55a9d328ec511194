"""Schedules at run time: pause, resume, trigger and backfill (``plaita schedules …``).

- **pause** / **resume**: a paused schedule starts nothing; the keeper still moves its newest
  tick on (the ticks that pass while paused are dropped, not caught up on resume: ``backfill``
  starts them if wanted). The state is the schedule hash's ``paused`` field
  (``plaita.store.schedule_control``), shown by ``schedules list`` and the dashboard.
- **trigger**: one execution now, outside the schedule (id ``schedule:<flow>:trigger:<hex>``;
  its params the schedule's, ``scheduled.trigger`` true).
- **backfill** ``from``..``to``: each cron tick in that range (``from`` <= tick <= ``to`` <= now)
  started once, under the tick's own id and dedup key (``execution_id_of``): a tick that ran, or
  a second backfill, starts nothing new. Refused above ``max_ticks`` ticks (default 100).

The schedule is the flow's as loaded (``flows``), else the one recorded for the queue, else the
one a keeper last ran (as ``schedules list`` finds it).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass

from plaita.clock import wall_s
from plaita.errors import PlaitaError
from plaita.flows.keeper.schedule_records import scheduled_flows
from plaita.flows.model.definition import Flow
from plaita.flows.model.schedules import PARAM_KEY, Schedule, execution_id_of
from plaita.flows.producer.client import DuplicateStart, FlowClient, _operator
from plaita.flows.schedule_listing import schedule_definition
from plaita.store.executions.schedule_store import UnreadableSchedule
from plaita.store.schedule_control import PAUSED_FIELD, ScheduleAccess

#: Ticks one backfill starts at most unless told otherwise (``max_ticks``).
DEFAULT_MAX_TICKS = 100
#: The most ``max_ticks`` may be (the cron walk is bounded too).
MAX_TICKS_LIMIT = 10_000


class ScheduleNotFound(PlaitaError):
    """No schedule of that flow: not loaded, not recorded for the queue, never run by a keeper."""


class TooManyTicks(PlaitaError):
    """A backfill over more ticks than ``max_ticks`` (nothing started)."""


@dataclass(frozen=True)
class Tick:
    """One tick of a backfill: its time, its execution id, and whether this call started it."""

    tick_s: int
    execution_id: str
    started: bool


class ScheduleControl:
    """Pause, resume, trigger and backfill the schedules of ``flows``' queue (its tenant's
    executions: the default tenant's, as the keeper's)."""

    def __init__(self, flows: FlowClient, loaded: Iterable[Flow] = ()) -> None:
        self.flows = flows
        self.loaded = dict(scheduled_flows(loaded))
        self._access = ScheduleAccess(flows.store, flows.queue.keyspace.queue)
        self._store = self._access.schedules

    def schedule(self, flow_id: str) -> Schedule:
        """The flow's schedule; ScheduleNotFound (UnreadableSchedule for a hash of another type)."""
        recorded = self._access.records.read()
        record = self._store.read(flow_id)
        if flow_id not in self.loaded and flow_id not in recorded and not record.get("cron"):
            raise ScheduleNotFound(f"no schedule of flow {flow_id!r} (not loaded, recorded or run by a keeper)")
        found = schedule_definition(self.loaded, recorded, flow_id, record)
        if found.schedule is None:
            raise ScheduleNotFound(f"schedule of flow {flow_id!r} is unusable: {found.error}")
        return found.schedule

    def paused(self, flow_id: str) -> bool:
        try:
            return bool(self._store.read(flow_id).get(PAUSED_FIELD))
        except UnreadableSchedule:
            return False

    def pause(self, flow_id: str, *, by: str | None = None) -> bool:
        """Pause it (True: it was running; False: it was paused already)."""
        self.schedule(flow_id)
        return self._access.set_paused(flow_id, True, now_s=wall_s(), by=by or _operator())

    def resume(self, flow_id: str) -> bool:
        """Resume it (True: it was paused). The ticks that passed while paused are not started."""
        self.schedule(flow_id)
        return self._access.set_paused(flow_id, False, now_s=wall_s(), by="")

    def trigger(self, flow_id: str) -> str:
        """Start one execution of the flow now, outside its schedule; returns its id."""
        schedule, now_s = self.schedule(flow_id), wall_s()
        params = schedule.tick_params(int(now_s))
        params[PARAM_KEY]["trigger"] = True
        eid = f"schedule:{flow_id}:trigger:{uuid.uuid4().hex[:12]}"
        return self.flows.start(flow_id, params, execution_id=eid)

    def backfill(
        self,
        flow_id: str,
        from_s: float,
        to_s: float,
        *,
        max_ticks: int = DEFAULT_MAX_TICKS,
        dry_run: bool = False,
    ) -> list[Tick]:
        """Start each tick from ``from_s`` to ``to_s`` (both included, at most now) not started
        yet, oldest first. ValueError for a bad range; TooManyTicks above ``max_ticks``."""
        if not 1 <= max_ticks <= MAX_TICKS_LIMIT:
            raise ValueError(f"max_ticks must be from 1 to {MAX_TICKS_LIMIT}, not {max_ticks}")
        now_s = wall_s()
        if not from_s <= to_s or to_s > now_s:
            raise ValueError("a backfill needs from <= to <= now (the future is the schedule's)")
        schedule = self.schedule(flow_id)
        ticks, more = schedule.due_ticks(from_s - 1, to_s, limit=max_ticks + 1)
        ticks = [t for t in ticks if t >= from_s]
        if more or len(ticks) > max_ticks:
            raise TooManyTicks(
                f"more than {max_ticks} ticks of {schedule.cron!r} between them; nothing started "
                "(a narrower range, or a larger max_ticks / --max-ticks)"
            )
        return [self._tick(flow_id, schedule, t, dry_run) for t in sorted(ticks)]

    def _tick(self, flow_id: str, schedule: Schedule, tick_s: int, dry_run: bool) -> Tick:
        eid = execution_id_of(flow_id, tick_s)
        if self.flows.store.get(eid) is not None:  # ran (its dedup key may have expired since)
            return Tick(tick_s, eid, False)
        if dry_run:
            return Tick(tick_s, eid, True)
        params = schedule.tick_params(tick_s)
        params[PARAM_KEY]["backfill"] = True
        try:
            self.flows.start(flow_id, params, execution_id=eid, dedup_key=eid, on_duplicate="raise")
        except DuplicateStart:
            return Tick(tick_s, eid, False)
        return Tick(tick_s, eid, True)
