"""A flow's limits changed at run time (``plaita limits set | clear | show``), in Redis.

The record is the flow's ``…:limits`` hash (``plaita.store.executions.flow_limits``): the slot
scripts read it themselves at every acquire, release and sweep, so every worker of the fleet
obeys a change at its next one, with no restart, no polling and no window where two workers
disagree (the script that reads it is the one that counts the slots). A field overrides a limit
the flow declares; a flow that declares none is not checked at all (no round trip for it), so a
record for it changes nothing. Raising ``max_concurrent`` (or ``max_concurrent_per_key``) here
also gives the new free slots to the parked starts at once; without it they would move at the
next release or sweep (ttl/3).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import redis

from plaita.errors import ConfigError
from plaita.store.executions.flow_limits import FlowLimitStore, flow_keys, limited_index, parking_index
from plaita.store.keyspace import Keyspace
from plaita.store.streams.entries import as_text

#: The fields of a limits record, in the order ``show`` lists them.
FIELDS = ("max_concurrent", "max_starts_per_s", "max_concurrent_per_key")


@dataclass(frozen=True)
class FlowLimitsNow:
    """One flow's run-time limits (None = the declared one holds) and what its slots hold now."""

    flow_id: str
    max_concurrent: int | None
    max_starts_per_s: float | None
    max_concurrent_per_key: int | None
    #: Executions holding one of the flow's own slots (``max_concurrent``) now.
    running: int
    #: Starts parked for a slot (every concurrency key's included).
    waiting: int

    def as_dict(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in ("flow_id", *FIELDS, "running", "waiting")}


def checked(
    max_concurrent: int | None, max_starts_per_s: float | None, max_concurrent_per_key: int | None
) -> dict[str, str]:
    """The fields to write, checked (ConfigError names the bad one); at least one is needed."""
    fields: dict[str, str] = {}
    for name, value in (("max_concurrent", max_concurrent), ("max_concurrent_per_key", max_concurrent_per_key)):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name} must be an int >= 1, got {value!r}")
        fields[name] = str(value)
    rate = max_starts_per_s
    if rate is not None:
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 < rate < math.inf:
            raise ConfigError(f"max_starts_per_s must be a number > 0, got {rate!r}")
        fields["max_starts_per_s"] = repr(float(rate))
    if not fields:
        raise ConfigError("no limit given (max_concurrent, max_starts_per_s or max_concurrent_per_key)")
    return fields


class LimitOverrides:
    """Write, clear and read the run-time limits of the flows of one queue."""

    def __init__(self, client: redis.Redis, ks: Keyspace, *, ttl_s: float) -> None:
        self.client = client
        self.ks = ks
        #: The slot ttl of a reservation this side makes for a parked start (the workers' lease ttl).
        self.ttl_s = ttl_s

    @classmethod
    def sharing(cls, store: Any, *, ttl_s: float) -> LimitOverrides:
        """The run-time limits on the client and keyspace of ``store`` (an ``ExecutionStore``)."""
        return cls(store.client, store.ks, ttl_s=ttl_s)

    def set(self, flow_id: str, fields: dict[str, str]) -> None:
        """Merge ``fields`` (``checked``) into ``flow_id``'s record, then give the slots a raised
        limit frees to the oldest parked starts (put back on their streams)."""
        k = flow_keys(self.ks, flow_id)
        pipe = self.client.pipeline(transaction=False)
        pipe.hset(k.limits, mapping=fields)  # type: ignore[arg-type]
        pipe.sadd(limited_index(self.ks), flow_id)
        pipe.execute()
        slots = FlowLimitStore(self.client, self.ks)
        if "max_concurrent" in fields:
            slots.promote(flow_id, max_concurrent=int(fields["max_concurrent"]), ttl_s=self.ttl_s)
        if "max_concurrent_per_key" in fields:
            per_key = int(fields["max_concurrent_per_key"])
            for scope in slots.parked_keys(flow_id):
                slots.promote_scope(flow_id, scope, max_concurrent=per_key, ttl_s=self.ttl_s)

    def clear(self, flow_id: str) -> bool:
        """Drop ``flow_id``'s record (its declared limits hold again); False if it had none."""
        pipe = self.client.pipeline(transaction=False)
        pipe.delete(flow_keys(self.ks, flow_id).limits)
        pipe.srem(limited_index(self.ks), flow_id)
        deleted, _ = pipe.execute()
        return bool(deleted)

    def show(self, flow_id: str | None = None) -> list[FlowLimitsNow]:
        """``flow_id``'s limits now, or those of every flow with a record or parked starts."""
        if flow_id is not None:
            flows = [flow_id]
        else:
            names = self.client.sunion([limited_index(self.ks), parking_index(self.ks)])
            flows = sorted(as_text(f) for f in names)
        now_s, micros = self.client.time()
        now_ms = now_s * 1000 + micros // 1000
        pipe = self.client.pipeline(transaction=False)
        for f in flows:
            k = flow_keys(self.ks, f)
            pipe.hmget(k.limits, list(FIELDS))
            pipe.zcount(k.slots, f"({now_ms}", "+inf")
            pipe.hlen(k.parked_tasks)
        replies = pipe.execute() if flows else []
        out = []
        for i, f in enumerate(flows):
            raw, running, waiting = replies[3 * i : 3 * i + 3]
            limit, rate, per_key = (None if v is None else as_text(v) for v in raw)
            out.append(
                FlowLimitsNow(
                    f,
                    None if limit is None else int(limit),
                    None if rate is None else float(rate),
                    None if per_key is None else int(per_key),
                    int(running),
                    int(waiting),
                )
            )
        return out
