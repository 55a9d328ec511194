"""Schedules are a fleet fact: each worker and keeper that loads a scheduled flow records its
schedule (flow, cron, tz, policy, params) in Redis for its queue, and the keeper that holds that
queue's lease starts the ticks of every recorded schedule, whatever flows it loaded itself (the
start of a flow it does not load is just an enqueue, as for any producer).

The rules (docs/flows.md, *Schedules*):

- A loader records its schedules when it starts (a worker within a second, a keeper on its first
  pass) and again every ``RECORD_REFRESH_S``; a record holds when it was last refreshed.
- A record not refreshed for ``RECORD_TTL_S`` is stale: nothing loads that schedule any more (it
  was removed from the code, or its flow renamed). Its ticks stop and the acting keeper forgets it.
- The acting keeper remembers the records it read and marks the hash; when the mark is gone
  (Redis lost its data, a failover to a replica that lagged) its next pass records again every
  fresh record it remembers, and its own schedules. A record deleted by hand from a marked hash
  stays deleted (until a loader records it again).
- A record that cannot be read back (not JSON, or a schedule plaita refuses, such as a cron that
  never fires) is skipped with one error line; the rest of the pass goes on.
- Where a keeper loads the flow itself, its own definition is the one it runs (and records).
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from plaita.clock import wall_s
from plaita.errors import ConfigError
from plaita.flows.keeper_io import ScheduleRecordsIO, UnreadableIndex
from plaita.flows.model.definition import Flow
from plaita.flows.model.schedules import Schedule, schedule_of

logger = logging.getLogger(__name__)

#: A loader records its schedules again this often (seconds).
RECORD_REFRESH_S = 60.0
#: A record not refreshed for this long is stale: its schedule stops (seconds).
RECORD_TTL_S = 3600.0

Scheduled = list[tuple[str, Schedule]]


def scheduled_flows(flows: Iterable[Flow]) -> Scheduled:
    out = []
    for f in flows:
        schedule = schedule_of(f.schedule)
        if schedule is not None:
            out.append((f.flow_id, schedule))
    return out


def loader_name() -> str:
    """Who recorded a schedule (``by`` in its record): host and process."""
    return f"{socket.gethostname()}:{os.getpid()}"


def record_of(schedule: Schedule, recorded_at_s: float, by: str) -> str:
    doc = {**schedule.describe(), "grace_s": schedule.grace_s, "params": dict(schedule.params)}
    return json.dumps({**doc, "recorded_at_s": recorded_at_s, "by": by}, sort_keys=True)


@dataclass(frozen=True)
class Recorded:
    """A record read back: its schedule, or why it is unusable."""

    schedule: Schedule | None
    recorded_at_s: float
    error: str | None = None

    def stale(self, now_s: float, ttl_s: float) -> bool:
        return now_s - self.recorded_at_s > ttl_s


def read_record(text: str) -> Recorded:
    try:
        doc: Any = json.loads(text)
    except ValueError:
        return Recorded(None, math.nan, "recorded schedule is not JSON")
    if not isinstance(doc, dict):
        return Recorded(None, math.nan, "recorded schedule is not a JSON object")
    at_s = doc.get("recorded_at_s")
    recorded_at_s = float(at_s) if isinstance(at_s, int | float) and math.isfinite(at_s) else math.nan
    try:
        schedule = Schedule(
            doc.get("cron"),  # type: ignore[arg-type]  # checked by Schedule
            tz=doc.get("tz", "UTC"),
            missed=doc.get("missed", "skip"),
            max_catchup=doc.get("max_catchup", 100),
            grace_s=doc.get("grace_s", 60.0),
            params=doc.get("params", {}),
        )
    except (ConfigError, TypeError, ValueError) as exc:
        return Recorded(None, recorded_at_s, f"recorded schedule unusable: {exc}")
    return Recorded(schedule, recorded_at_s)


def _definition(text: str) -> Any:
    """A record without when and by whom: two records of one definition compare equal."""
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    return {k: v for k, v in doc.items() if k not in ("recorded_at_s", "by")} if isinstance(doc, dict) else None


class ScheduleRecorder:
    """Records the schedules of the flows a worker (or keeper) loads, on its queue: ``refresh``
    (best effort, never raises) writes them when ``refresh_s`` has passed since the last write."""

    def __init__(
        self, flows: Iterable[Flow], records: ScheduleRecordsIO, *, refresh_s: float = RECORD_REFRESH_S
    ) -> None:
        self.schedules = scheduled_flows(flows)
        self.records = records
        self.refresh_s = refresh_s
        self.by = loader_name()
        self._written_at_s = -math.inf  # monotonic
        self._failing = False

    def refresh(self, now_s: float | None = None) -> bool:
        """Record the schedules if due; False if that failed (logged once until it works again)."""
        if not self.schedules or time.monotonic() - self._written_at_s < self.refresh_s:
            return True
        at_s = wall_s() if now_s is None else now_s
        try:
            self.records.write({f: record_of(s, at_s, self.by) for f, s in self.schedules})
        except Exception as exc:  # best effort: the next call tries again
            level = logging.DEBUG if self._failing else logging.WARNING
            logger.log(
                level, "schedules not recorded in %s (%s: %s); retrying", self.records.key, type(exc).__name__, exc
            )
            self._failing = True
            return False
        self._failing = False
        self._written_at_s = time.monotonic()
        return True


class FleetSchedules:
    """What the acting keeper of a queue runs: its own schedules, then every fresh one recorded."""

    def __init__(self, own: Scheduled, records: ScheduleRecordsIO, *, ttl_s: float = RECORD_TTL_S) -> None:
        self.own = own
        self.records = records
        self.ttl_s = ttl_s
        self.refresh_s = min(RECORD_REFRESH_S, ttl_s / 2)
        self.by = loader_name()
        #: The records read by the last pass: one of them gone missing while fresh is written again.
        self._remembered: dict[str, str] = {}

    def current(self, now_s: float, *, dry_run: bool) -> tuple[Scheduled, list[tuple[str, str]]]:
        """(the schedules to run, the records skipped as (item, why)); records again what is
        missing or due (not in a dry run) and forgets stale records."""
        try:
            found, marked = self.records.read_marked()
        except UnreadableIndex as unreadable:
            return list(self.own), [(unreadable.key, str(unreadable))]
        if not dry_run:
            found.update(self._write_back(found, marked, now_s))
        self._remembered = dict(found)
        own_ids = {f for f, _ in self.own}
        run, bad = list(self.own), list[tuple[str, str]]()
        for flow_id, text in sorted(found.items()):
            if flow_id in own_ids:
                continue
            rec = read_record(text)
            if rec.schedule is None:
                bad.append((f"{self.records.key}#{flow_id}", rec.error or "unusable"))
            elif rec.stale(now_s, self.ttl_s):
                self._forget(flow_id, text, rec, now_s, dry_run=dry_run)
            else:
                run.append((flow_id, rec.schedule))
        return run, bad

    def _write_back(self, found: dict[str, str], marked: bool, now_s: float) -> dict[str, str]:
        """Own records missing, changed or due for a refresh and, when the mark is gone (a data
        loss), every fresh record remembered: written (with the mark), and returned."""
        out = self._own_due(found, now_s)
        if not marked:
            for flow_id, text in self._remembered.items():
                if flow_id not in found and flow_id not in out and not read_record(text).stale(now_s, self.ttl_s):
                    out[flow_id] = text
        self.records.write(out, mark=None if marked else json.dumps({"by": self.by, "at_s": now_s}))
        return out

    def _own_due(self, found: dict[str, str], now_s: float) -> dict[str, str]:
        """Own records to write: missing, of another definition, or due for a refresh."""
        out = {}
        for flow_id, schedule in self.own:
            mine, theirs = record_of(schedule, now_s, self.by), found.get(flow_id)
            if theirs is None or _definition(theirs) != _definition(mine) or self._due(theirs, now_s):
                out[flow_id] = mine
        return out

    def _due(self, text: str, now_s: float) -> bool:
        return not now_s - read_record(text).recorded_at_s < self.refresh_s  # NaN (unreadable): due

    def _forget(self, flow_id: str, text: str, rec: Recorded, now_s: float, *, dry_run: bool) -> None:
        self._remembered.pop(flow_id, None)
        if dry_run or not self.records.forget(flow_id, text):
            return
        logger.info(
            "keeper: schedule %s not recorded again for %.0f s (no worker or keeper loads it); forgotten",
            flow_id,
            now_s - rec.recorded_at_s,
        )

    def refresh_own(self, now_s: float) -> None:
        """A keeper on standby records its own schedules too (when due): the acting one runs them."""
        if not self.own:
            return
        try:
            self.records.write(self._own_due(self.records.read(), now_s))
        except UnreadableIndex as bad:
            logger.debug("keeper: %s; schedules not recorded", bad)
