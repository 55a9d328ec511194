"""Redis calls of child executions (fan-out / fan-in): tasks enqueued on the execution's own
partition stream, and cancel flags set in bulk.

Each call is a non-transactional pipeline: every key it touches is one execution's (or one
partition stream), so on Redis Cluster no call needs keys of two slots to change together.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis

from plaita.store import scripts
from plaita.store.keyspace import Keyspace, key_id
from plaita.tasks import PAYLOAD_FIELD, SCHEMA_FIELD, encode_body

#: Cancel flags outlive any execution that could still read them (as ``request_cancel``'s).
CANCEL_TTL_S = 7 * 24 * 3600
MARK_DONE = scripts.script("mark_child_done")
#: ``<prefix>{tag}:<parent>:<step>:<k>``: which children of one spawn have ended.
DONE_PREFIX = "plaita:execution:children:"


def enqueue_tasks(client: redis.Redis, ks: Keyspace, bodies: Sequence[dict[str, Any]]) -> None:
    """XADD each body to the stream of its execution's partition (one pipeline)."""
    if not bodies:
        return
    pipe = client.pipeline(transaction=False)
    for body in bodies:
        stream = ks.stream(ks.partition_of(str(body["execution_id"])))
        pipe.xadd(stream, {PAYLOAD_FIELD: encode_body(body), SCHEMA_FIELD: "1"})
    pipe.execute()


def request_cancels(client: redis.Redis, ks: Keyspace, execution_ids: Sequence[str]) -> None:
    """Set the cancel flag of every execution in ``execution_ids`` (one pipeline)."""
    if not execution_ids:
        return
    pipe = client.pipeline(transaction=False)
    for eid in execution_ids:
        pipe.set(ks.cancel_key(eid), "1", ex=CANCEL_TTL_S)
    pipe.execute()


def done_key(ks: Keyspace, parent_id: str, prefix: str) -> str:
    """The set of the indexes of a spawn's children that have ended: in the parent's slot."""
    tag, done = ks.slot_tag(parent_id), ks.named(DONE_PREFIX)  # in the parent's tenant namespace
    # ``prefix`` is ``<parent>:<step>:<join>``: the parent's id goes in as every id does (``key_id``).
    spawn = key_id(parent_id) + prefix[len(parent_id) :] if prefix.startswith(parent_id) else key_id(prefix)
    return f"{done}{tag}:{spawn}" if tag else f"{done}{spawn}"


def mark_done(client: redis.Redis, ks: Keyspace, parent_id: str, prefix: str, index: int) -> int:
    """Add child ``index`` to its spawn's done set (one key, one script: a one-slot call on a
    cluster too); returns how many of the spawn's children have ended, -1 once the parent joined.
    The set has no expiry while the parent waits (children may take weeks)."""
    return int(MARK_DONE(client, [done_key(ks, parent_id, prefix)], [index]))


def done_count(client: redis.Redis, ks: Keyspace, parent_id: str, prefix: str) -> int:
    """How many of the spawn's children have ended; -1 once the parent joined them."""
    key = done_key(ks, parent_id, prefix)
    if client.type(key) in (b"string", "string"):
        return -1
    return int(client.scard(key))


def close_spawn(client: redis.Redis, ks: Keyspace, parent_id: str, prefix: str) -> None:
    """The parent joined: its done set becomes a marker that expires like an ended execution,
    so a late notification neither recreates the set nor wakes the parent again."""
    client.set(done_key(ks, parent_id, prefix), "joined", ex=CANCEL_TTL_S)
