"""The schedules a queue's fleet loads, as recorded by each worker and keeper that loads one.

``plaita:schedules:recorded:{<queue>}`` (hash, one per queue): field the flow id, value the JSON
record a loader wrote (``plaita.flows.keeper.schedule_records`` builds and reads it); the field ``""``
(never a flow id) is the acting keeper's mark: a hash without it lost its data since that keeper
wrote it (or no keeper wrote it yet). The queue's name
is the hash tag, as in the queue's keeper lease (``keeper_lease_key``): on a cluster a queue's
keeper keys share a slot, whatever its name holds. Each call touches this one key.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import redis

from plaita.store import scripts
from plaita.store.executions.execution_docs import reply_text
from plaita.store.executions.keeper_store import index_of

RECORDS_PREFIX = "plaita:schedules:recorded:"
#: The field a keeper sets beside the records (flow ids are never empty).
KEEPER_MARK = ""

FORGET = scripts.script("forget_schedule_record")


def records_key(queue: str) -> str:
    return f"{RECORDS_PREFIX}{{{queue}}}"


class ScheduleRecords:
    """The recorded schedules of one queue, on one client (bytes replies)."""

    def __init__(self, client: redis.Redis, queue: str) -> None:
        self.client = client
        self.key = records_key(queue)

    @classmethod
    def sharing(cls, other: Any, queue: str) -> ScheduleRecords:
        """``queue``'s records on the client of ``other`` (a queue or an execution store)."""
        return cls(other.client, queue)

    def read(self) -> dict[str, str]:
        """Every record, by flow id; UnreadableIndex when the key is not a hash."""
        return self.read_marked()[0]

    def read_marked(self) -> tuple[dict[str, str], bool]:
        """(every record by flow id, whether the keeper's mark is there)."""
        with index_of(self.key):
            raw = cast(dict[Any, Any], self.client.hgetall(self.key))
        found = {reply_text(k): reply_text(v) for k, v in raw.items()}
        marked = found.pop(KEEPER_MARK, None) is not None
        return found, marked

    def write(self, records: Mapping[str, str], *, mark: str | None = None) -> None:
        """Record (or refresh) these flows' records, and the keeper's ``mark`` if given;
        UnreadableIndex when the key is not a hash."""
        fields = {**records, **({KEEPER_MARK: mark} if mark is not None else {})}
        if fields:
            with index_of(self.key):
                self.client.hset(self.key, mapping=cast(Mapping[Any, Any], fields))

    def forget(self, flow_id: str, record: str) -> bool:
        """Delete ``flow_id``'s record if it still is ``record`` (nobody recorded it since)."""
        with index_of(self.key):
            return int(FORGET(self.client, [self.key], [flow_id, record])) == 1
