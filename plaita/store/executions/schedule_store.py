"""The bookkeeping of flow schedules, one hash per scheduled flow.

Keys (each call touches one key, so a cluster needs no hash tag; a schedule's executions go
to whatever partition their id hashes to, and their dedup key with them):

- ``plaita:schedule:{flow}`` (hash): ``last_tick_s`` the newest tick claimed (started, or
  dropped by the missed-ticks policy), ``checked_at_s`` when; ``pending`` / ``pending_at_s``
  ticks claimed whose starts are not yet confirmed enqueued (JSON ``{"ticks": [...],
  "missed": n}``); ``last_execution_id`` and ``last_started_tick_s`` the newest tick
  started; ``cron``, ``tz``, ``missed``, ``max_catchup`` the definition the keeper last ran
  it with (what ``plaita schedules list`` shows without the flow modules).
- ``plaita:schedules`` (set): the flows that have such a hash.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import redis

from plaita.errors import PlaitaError
from plaita.store import scripts
from plaita.store.executions.execution_docs import is_wrongtype, reply_text
from plaita.store.executions.keeper_store import UnreadableIndex, index_of

SCHEDULE_PREFIX = "plaita:schedule:"
SCHEDULES_KEY = "plaita:schedules"

CLAIM = scripts.script("claim_schedule_ticks")
CONFIRM = scripts.script("confirm_schedule_ticks")


class UnreadableSchedule(PlaitaError):
    """A schedule key that is not a hash (not written by plaita): skipped, never overwritten."""

    def __init__(self, key: str) -> None:
        super().__init__(f"{key} is not a hash")
        self.key = key


def schedule_key(flow_id: str) -> str:
    return SCHEDULE_PREFIX + flow_id


class ScheduleStore:
    """Schedule hashes on one client (bytes replies)."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client

    @classmethod
    def sharing(cls, other: Any) -> ScheduleStore:
        """The schedules on the client of ``other`` (a queue or an execution store)."""
        return cls(other.client)

    def key(self, flow_id: str) -> str:
        """The flow's schedule hash (``schedule_key``), for messages about it."""
        return schedule_key(flow_id)

    def read(self, flow_id: str) -> dict[str, str]:
        """The schedule's fields ({} when never run); UnreadableSchedule for a key of another type."""
        key = schedule_key(flow_id)
        try:
            raw = cast(dict[Any, Any], self.client.hgetall(key))
        except redis.ResponseError as exc:
            if is_wrongtype(exc):
                raise UnreadableSchedule(key) from None
            raise
        return {reply_text(k): reply_text(v) for k, v in raw.items()}

    def read_many(self, flow_ids: list[str]) -> list[dict[str, str] | UnreadableSchedule]:
        pipe = self.client.pipeline(transaction=False)
        for f in flow_ids:
            pipe.hgetall(schedule_key(f))
        out: list[dict[str, str] | UnreadableSchedule] = []
        for f, raw in zip(flow_ids, pipe.execute(raise_on_error=False), strict=True):
            if is_wrongtype(raw):
                out.append(UnreadableSchedule(schedule_key(f)))
            elif isinstance(raw, Exception):
                raise raw
            else:
                out.append({reply_text(k): reply_text(v) for k, v in cast(dict[Any, Any], raw).items()})
        return out

    def known(self) -> list[str]:
        """Flows with a schedule hash, sorted; UnreadableIndex when ``plaita:schedules`` is not a set."""
        with index_of(SCHEDULES_KEY):
            return sorted(reply_text(m) for m in cast(set[Any], self.client.smembers(SCHEDULES_KEY)))

    def describe(self, flow_id: str, definition: Mapping[str, Any]) -> None:
        """Record the definition a keeper runs (for listing without the flow modules);
        UnreadableSchedule or UnreadableIndex for a key of another type."""
        key = schedule_key(flow_id)
        pipe = self.client.pipeline(transaction=False)
        pipe.hset(key, mapping={k: str(v) for k, v in definition.items()})
        pipe.sadd(SCHEDULES_KEY, flow_id)
        written, listed = pipe.execute(raise_on_error=False)
        for reply, bad in ((written, UnreadableSchedule(key)), (listed, UnreadableIndex(SCHEDULES_KEY))):
            if is_wrongtype(reply):
                raise bad
            if isinstance(reply, Exception):
                raise reply

    def claim(self, flow_id: str, seen_last: str, newest_s: int, pending: str, at: str) -> bool:
        """Move ``last_tick_s`` from ``seen_last`` to ``newest_s``, with ``pending`` (JSON, or
        "" for none) to start (see the script)."""
        args = [seen_last, str(newest_s), pending, at]
        return int(CLAIM(self.client, [schedule_key(flow_id)], args)) == 1

    def confirm(self, flow_id: str, pending: str, pending_at: str, execution_id: str, tick_s: int) -> bool:
        args = [pending, pending_at, execution_id, str(tick_s)]
        return int(CONFIRM(self.client, [schedule_key(flow_id)], args)) == 1
