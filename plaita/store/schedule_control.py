"""An operator's hold on a schedule: the ``paused`` field of its hash (``plaita:schedule:{flow}``).

``paused`` holds ``<epoch seconds> <who>`` while the schedule is paused; the keeper's pass reads
it with the rest of the hash (``ScheduleStore.read``) and starts nothing while it is there. The
flow is added to ``plaita:schedules`` so ``schedules list`` shows a schedule paused before any
keeper ran it. One key per call, as every schedule call (no hash tag needed on a cluster).
"""

from __future__ import annotations

import redis

from plaita.store.schedule_store import SCHEDULES_KEY, schedule_key

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
