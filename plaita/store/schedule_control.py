"""An operator's hold on a schedule: the ``paused`` field of its hash (``plaita:schedule:{flow}``).

``paused`` holds ``<epoch seconds> <who>`` while the schedule is paused; the keeper's pass reads
it with the rest of the hash (``ScheduleStore.read``) and starts nothing while it is there. The
flow is added to ``plaita:schedules`` so ``schedules list`` shows a schedule paused before any
keeper ran it. One key per call, as every schedule call (no hash tag needed on a cluster).
"""

from __future__ import annotations

import redis

from plaita.store.executions.schedule_records import ScheduleRecords
from plaita.store.executions.schedule_store import SCHEDULES_KEY, ScheduleStore, schedule_key
from plaita.store.executions.store import ExecutionStore

#: The schedule hash's field of a pause: ``<epoch seconds> <who>``.
PAUSED_FIELD = "paused"


def set_paused(client: redis.Redis, flow_id: str, paused: bool, *, now_s: float, by: str) -> bool:
    """Pause (or resume) ``flow_id``'s schedule; True when that changed anything."""
    key = schedule_key(flow_id)
    if not paused:
        return int(client.hdel(key, PAUSED_FIELD)) == 1
    pipe = client.pipeline(transaction=False)
    pipe.hsetnx(key, PAUSED_FIELD, f"{now_s!r} {by}")
    pipe.sadd(SCHEDULES_KEY, flow_id)
    changed, _ = pipe.execute()
    return int(changed) == 1


class ScheduleAccess:
    """The schedule keys one execution store's client reaches, for the run-time controls
    (``plaita.flows.schedule_control``): nothing above store/ holds the raw client."""

    def __init__(self, store: ExecutionStore, queue_name: str) -> None:
        self._client = store.client
        #: The schedule hashes (``plaita:schedule:{flow}``) and their set.
        self.schedules = ScheduleStore(store.client)
        #: What the keepers recorded of the schedules they run, for this queue.
        self.records = ScheduleRecords(store.client, queue_name)

    def set_paused(self, flow_id: str, paused: bool, *, now_s: float, by: str) -> bool:
        """``set_paused`` on this store's client."""
        return set_paused(self._client, flow_id, paused, now_s=now_s, by=by)
