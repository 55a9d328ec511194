"""Schedules: a flow declares a cron expression; the keeper starts one execution per tick.

Pure: no Redis (the keeper's pass is ``plaita.flows.keeper.scheduler``). ::

    sync = Flow("sync", schedule=Schedule("*/5 * * * *", tz="Europe/Paris", missed="once"))

The expression is croniter's: five fields, or six with seconds last (``* * * * * */10``).
Ticks are computed in ``tz`` (an IANA name; default UTC), so ``0 9 * * *`` in Europe/Paris is
08:00 UTC in winter and 07:00 UTC in summer. A local time that does not exist (the hour
skipped in spring) runs at the first time after it; one that happens twice (autumn) runs twice.

A tick is *on time* if it is at most ``grace_s`` old when the keeper sees it; older ones were
*missed* (the keeper was down) and ``missed`` decides: ``skip`` runs none of them, ``once``
runs one execution (at the newest due tick) for all of them, ``all`` runs each, oldest first,
at most ``max_catchup`` (the newest ones). A schedule the keeper meets for the first time
starts with its on-time ticks: nothing before it was missed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterError, croniter

from plaita.errors import ConfigError
from plaita.flows.model.validate import json_problem

MISSED_POLICIES = ("skip", "once", "all")
#: A tick this old when first seen is still on time (a keeper passes every 5 s; a Redis blip
#: or a keeper handover must not make a tick "missed").
DEFAULT_GRACE_S = 60.0
DEFAULT_MAX_CATCHUP = 100
#: At most this many due ticks are examined (and counted) per schedule and pass; bounds ``max_catchup``.
MAX_CATCHUP_LIMIT = 10_000
#: The key of ``params`` under which a scheduled execution finds its tick.
PARAM_KEY = "scheduled"


@dataclass(frozen=True)
class Plan:
    """One pass's decision for one schedule."""

    #: Ticks to start, oldest first (epoch seconds).
    ticks: list[int]
    #: The newest due tick (started or not): the schedule's bookkeeping moves to it (on first
    #: sight with nothing due, the time from which ticks count).
    newest_s: int | None
    #: Due ticks not started (missed and dropped by the policy, or past ``max_catchup``).
    dropped: int
    #: More ticks were due than ``max_catchup`` examines (``dropped`` is a lower bound).
    more: bool


@dataclass(frozen=True)
class Schedule:
    """When a flow runs by itself. ConfigError (at import of the flow module) for a bad
    expression, an unknown time zone, an unknown policy or params that are not a JSON object."""

    cron: str
    tz: str = "UTC"
    missed: str = "skip"
    max_catchup: int = DEFAULT_MAX_CATCHUP
    grace_s: float = DEFAULT_GRACE_S
    params: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        where = f"schedule {self.cron!r}"
        if not isinstance(self.cron, str) or not croniter.is_valid(self.cron):
            raise ConfigError(f"{where}: not a cron expression (5 fields, or 6 with seconds last)")
        try:
            ZoneInfo(self.tz)
        except (ZoneInfoNotFoundError, ValueError, TypeError):
            raise ConfigError(f"{where}: unknown time zone {self.tz!r} (an IANA name such as 'Europe/Paris')") from None
        never = _never_fires(self.cron, self.zone)
        if never is not None:
            raise ConfigError(f"{where}: never fires ({never}); a date that exists, such as '0 0 28 2 *'")
        if self.missed not in MISSED_POLICIES:
            raise ConfigError(f"{where}: missed must be one of {', '.join(MISSED_POLICIES)}, got {self.missed!r}")
        if not isinstance(self.max_catchup, int) or not 1 <= self.max_catchup <= MAX_CATCHUP_LIMIT:
            raise ConfigError(f"{where}: max_catchup must be a whole number from 1 to {MAX_CATCHUP_LIMIT}")
        if not isinstance(self.grace_s, (int, float)) or not math.isfinite(self.grace_s) or self.grace_s < 0:
            raise ConfigError(f"{where}: grace_s must be a finite number of seconds >= 0")
        if not isinstance(self.params, Mapping) or PARAM_KEY in self.params:
            raise ConfigError(f"{where}: params must be a dict without the key {PARAM_KEY!r} (plaita sets it)")
        problem = json_problem(dict(self.params))
        if problem is not None:
            raise ConfigError(f"{where}: params are not strict JSON ({problem})")

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.tz)

    def next_tick_s(self, now_s: float) -> int:
        """The first tick after ``now_s`` (epoch seconds)."""
        start = datetime.fromtimestamp(math.floor(now_s), self.zone)
        return int(croniter(self.cron, start).get_next(float))

    def due_ticks(self, after_s: float, now_s: float, limit: int = MAX_CATCHUP_LIMIT) -> tuple[list[int], bool]:
        """Ticks ``t`` with ``after_s < t <= now_s``, newest first, at most ``limit``; and
        whether older ones were left out."""
        # get_prev returns the tick strictly before its start: start one second past now.
        it = croniter(self.cron, datetime.fromtimestamp(math.floor(now_s) + 1, self.zone))
        out: list[int] = []
        while len(out) < limit:
            tick = int(it.get_prev(float))
            if tick <= after_s:
                return out, False
            out.append(tick)
        return out, int(it.get_prev(float)) > after_s

    def plan(self, after_s: float | None, now_s: float) -> Plan:
        """What to start at ``now_s`` per the policy; ``after_s`` is the newest tick already
        started (None: a schedule never seen before, so nothing before it was missed)."""
        first_sight = after_s is None
        if after_s is None:
            after_s = now_s - self.grace_s
        due, more = self.due_ticks(after_s, now_s)
        on_time = [t for t in due if now_s - t <= self.grace_s]
        missed = more or len(on_time) < len(due)
        if self.missed == "all":
            chosen = due[: self.max_catchup]
        elif self.missed == "once" and missed:
            chosen = due[:1]
        else:
            chosen = on_time
        # Seen for the first time with nothing due: remember from when, so that a downtime
        # before its first tick counts as missed.
        newest_s = due[0] if due else (math.floor(after_s) if first_sight else None)
        return Plan(sorted(chosen), newest_s, len(due) - len(chosen), more)

    def tick_params(self, tick_s: int, missed: int = 0) -> dict[str, Any]:
        """The params of the execution for ``tick_s``: the schedule's, plus ``scheduled``."""
        at = datetime.fromtimestamp(tick_s, self.zone).isoformat()
        return {**self.params, PARAM_KEY: {"tick_s": tick_s, "at": at, "missed": missed}}

    def describe(self) -> dict[str, Any]:
        return {"cron": self.cron, "tz": self.tz, "missed": self.missed, "max_catchup": self.max_catchup}


def _never_fires(cron: str, zone: ZoneInfo) -> str | None:
    """Why croniter cannot step ``cron`` from now (no tick after it, or none before it: 30
    February, 31 April), or None. ``croniter.is_valid`` checks the fields one by one only."""
    now = datetime.now(zone)
    try:
        croniter(cron, now).get_next(float)
        croniter(cron, now).get_prev(float)
    except (CroniterError, ValueError, OverflowError) as exc:
        return f"croniter: {exc}"
    return None


def schedule_of(value: Schedule | str | None) -> Schedule | None:
    """``Flow(schedule=...)``: a Schedule, a bare cron string (UTC, ``skip``), or None."""
    if value is None or isinstance(value, Schedule):
        return value
    if isinstance(value, str):
        return Schedule(value)
    raise ConfigError(f"schedule must be a Schedule or a cron string, got {type(value).__name__}")


def execution_id_of(flow_id: str, tick_s: int) -> str:
    """The execution id (and dedup key) of a flow's tick: the same on every keeper, so two
    keepers, or a keeper that crashed after enqueueing, never start a tick twice."""
    return f"schedule:{flow_id}:{tick_s}"


def utc_text(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
