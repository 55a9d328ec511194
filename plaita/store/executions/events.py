"""Named values a running step publishes (``ctx.publish``: progress, an intermediate result).

One hash per execution, ``plaita:execution:events:{id}`` (hash-tagged like the execution's other
keys, so its script stays in the execution's slot), field = name, value = a JSON record. Each
write is fenced by the execution's lease generation inside Lua, as every state write is. The
hash expires with the execution: the terminal checkpoint gives it the retention, a write while
the state has a TTL copies that TTL. A mixin of ``ExecutionStore``.
"""

from __future__ import annotations

import json
from typing import Any, cast

import redis

from plaita.store import scripts
from plaita.store.executions.execution_docs import is_wrongtype, reply_text
from plaita.store.keyspace import Keyspace

PUBLISH = scripts.script("publish_event")


def _record(raw: Any) -> dict[str, Any] | None:
    """A stored record (JSON object), or None when the field holds something else."""
    try:
        record = json.loads(reply_text(raw))
    except (ValueError, RecursionError):
        return None
    return record if isinstance(record, dict) else None


class EventAccess:
    """Publishing and reading the events of executions on one client, in ``ks``."""

    client: redis.Redis
    ks: Keyspace

    def publish_event(self, execution_id: str, generation: int, name: str, record_json: str, max_names: int) -> int:
        """1 written; 0 fenced out; -1 ``max_names`` other names exist; -2 the key is not a hash."""
        ks = self.ks
        keys = [
            ks.lease_key(execution_id),
            ks.fence_key(execution_id),
            ks.events_key(execution_id),
            ks.execution_key(execution_id),
        ]
        return int(PUBLISH(self.client, keys, [generation, name, record_json, max_names]))

    def events_key(self, execution_id: str) -> str:
        return self.ks.events_key(execution_id)

    def events(self, execution_id: str) -> dict[str, dict[str, Any]]:
        """Every event of the execution by name (records that are not JSON objects left out;
        a key of the wrong type reads as none)."""
        try:
            raw = cast(dict[Any, Any], self.client.hgetall(self.ks.events_key(execution_id)))
        except redis.ResponseError as exc:
            if is_wrongtype(exc):
                return {}
            raise
        out = {reply_text(k): _record(v) for k, v in raw.items()}
        return {k: v for k, v in sorted(out.items()) if v is not None}

    def event(self, execution_id: str, name: str) -> dict[str, Any] | None:
        """One event's record, or None."""
        try:
            raw = self.client.hget(self.ks.events_key(execution_id), name)
        except redis.ResponseError as exc:
            if is_wrongtype(exc):
                return None
            raise
        return None if raw is None else _record(raw)
