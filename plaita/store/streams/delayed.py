"""Delayed tasks: a sorted set per stream, moved onto the stream when due by every worker.

A task added with a delay (``add_tasks``, ``FlowClient.start(delay_s=…)``) is not XADDed: it is a
member ``"<id> <schema_version> <payload>"`` of the set ``<stream>:delayed`` (``Keyspace.delayed``),
scored by its due time in epoch milliseconds. Each worker's reclaim pass (every
``--reclaim-interval-s``) runs ``move_due``: one script per partition that XADDs the due members
to the stream and removes them from the set together, so a due task is added exactly once however
many workers move at once, and a worker killed mid-pass moves all or none (no single process is
needed; any live worker moves). The set and its stream share the partition's hash tag, so the
script is single-slot on Redis Cluster. A task runs at the earliest when due and normally within
one reclaim interval after; the due time is read on the producer's clock, the move on the
worker's (``plaita.clock.wall_s``, which ``plaita.testing.TestClock`` moves).
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass
from typing import Any, Protocol, cast

import redis

from plaita.clock import wall_s
from plaita.store import scripts
from plaita.tasks import PAYLOAD_FIELD, SCHEMA_FIELD, encode_body

#: The suffix of a stream's delayed set (``<stream>:delayed``: the stream's hash tag, its slot).
DELAYED_SUFFIX = ":delayed"
#: Longest delay (and furthest ``at``) accepted: 10 years, as a whole-execution deadline.
MAX_DELAY_S = 10 * 365 * 24 * 3600
#: Due tasks one move of one partition takes at most; the next pass takes the rest.
MOVE_BATCH = 1000
#: The ACL rules the move needs beyond an older worker's (``plaita.store.acl``).
MOVE_ACL = "+zcard +zrangebyscore +zrem"

_MOVE_DUE = scripts.script("move_due")


class _Stream(Protocol):
    stream: str

    def stream_for(self, priority: int = 0) -> str: ...


class Queue(Protocol):
    """What ``add_tasks`` needs of a queue (``StreamQueue``, ``PartitionedQueue``); a protocol, as
    the queue itself moves due tasks through this module."""

    client: redis.Redis

    def partition_queues(self) -> Any: ...

    def partition_for(self, body: dict[str, Any]) -> int: ...

    def enqueue_many(
        self, bodies: list[dict[str, Any]], *, schema_version: int = 1, priority: int = 0
    ) -> list[str]: ...


def delayed_key(stream: str) -> str:
    """The delayed set of ``stream`` (same hash tag, so one script touches both on a cluster)."""
    return stream + DELAYED_SUFFIX


def due_ms_of(delay_s: float | None, at_s: float | None, now_s: float) -> int:
    """The due time in epoch ms of a task delayed ``delay_s`` from ``now_s`` or due at ``at_s``
    (epoch seconds); 0 when it is due now (no delay, a zero delay, or an ``at`` not after now).
    ValueError for both given, or a value that is not a finite number within 10 years."""
    if delay_s is not None and at_s is not None:
        raise ValueError("give delay_s or at, not both")
    for name, value in (("delay_s", delay_s), ("at", at_s)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise ValueError(f"{name} must be a number of seconds, got {type(value).__name__}")
    if delay_s is not None and (not math.isfinite(delay_s) or not 0 <= delay_s <= MAX_DELAY_S):
        raise ValueError(f"delay_s must be within 0..{MAX_DELAY_S} s (10 years), got {delay_s!r}")
    if at_s is not None and (not math.isfinite(at_s) or at_s > now_s + MAX_DELAY_S):
        raise ValueError(f"at must be epoch seconds at most 10 years ahead, got {at_s!r}")
    due_s = at_s if at_s is not None else now_s + (delay_s or 0.0)
    return int(math.ceil(due_s * 1000)) if due_s > now_s else 0


@dataclass(frozen=True)
class DelayedMember:
    """One delayed task as its set holds it."""

    member_id: str
    due_ms: int
    member: str


def new_member_id() -> str:
    """A delayed task's id: unique, so equal bodies stay two tasks."""
    return "d-" + uuid.uuid4().hex


def delayed_member(
    body: dict[str, Any], due_ms: int, *, schema_version: int = 1, member_id: str | None = None
) -> DelayedMember:
    """The set member of ``body`` due at ``due_ms``, its id ``member_id`` or a new one (the one
    place the member's format is written; ``move_due`` reads it)."""
    member_id = member_id or new_member_id()
    return DelayedMember(member_id, due_ms, f"{member_id} {schema_version} {encode_body(body)}")


def add_tasks(
    queue: Queue,
    bodies: list[dict[str, Any]],
    *,
    delay_s: float | None = None,
    at_s: float | None = None,
    schema_version: int = 1,
    priority: int = 0,
) -> list[str]:
    """Add ``bodies`` to ``queue``, each on its partition: at once (their stream entry ids), or
    delayed ``delay_s`` seconds from now (``wall_s``) / due at ``at_s`` epoch seconds (their
    delayed member ids, ``d-…``). ValueError as ``due_ms_of``. The one way a producer adds a task
    with a delay: ``plaita enqueue --delay-s`` and the plain-task client call it. ``priority``
    (0..9): each goes to its partition's stream of that level, or that level's delayed set, so a
    delayed task lands on its level when due."""
    due_ms = due_ms_of(delay_s, at_s, wall_s())
    if due_ms == 0:
        return queue.enqueue_many(bodies, schema_version=schema_version, priority=priority)
    parts: list[_Stream] = queue.partition_queues()
    pipe = queue.client.pipeline(transaction=False)
    ids = []
    for body in bodies:
        m = delayed_member(body, due_ms, schema_version=schema_version)
        pipe.zadd(delayed_key(parts[queue.partition_for(body)].stream_for(priority)), {m.member: due_ms})
        ids.append(m.member_id)
    pipe.execute()
    return ids


def move_due(client: redis.Redis, stream: str, now_ms: int, limit: int = MOVE_BATCH) -> int:
    """Move up to ``limit`` members of ``stream``'s delayed set due at ``now_ms`` onto it (atomic);
    how many moved, -1 when a key holds the wrong type (nothing moved)."""
    args = [now_ms, limit, PAYLOAD_FIELD, SCHEMA_FIELD]
    return int(cast(int, _MOVE_DUE(client, [delayed_key(stream), stream], args)))


def make_due_now(client: redis.Redis, stream: str, due_ms: int, member_id: str) -> bool:
    """Make the delayed task ``member_id`` (due at ``due_ms``) due now: its score becomes 0, so the
    next move (any worker's reclaim pass) adds it to ``stream`` first. A read and a ZADD XX: a
    member moved meanwhile is not added back. False when it is not in the set (moved already)."""
    key, head = delayed_key(stream), (member_id + " ").encode()
    for member in cast(list[bytes | str], client.zrangebyscore(key, due_ms, due_ms)):
        raw = member if isinstance(member, bytes) else member.encode("utf-8", "surrogateescape")
        if raw.startswith(head):
            client.zadd(key, {raw: 0}, xx=True)
            return True
    return False


def delayed_count(client: redis.Redis, streams: list[str]) -> int:
    """Tasks waiting in the delayed sets of ``streams`` (one pipeline)."""
    pipe = client.pipeline(transaction=False)
    for stream in streams:
        pipe.zcard(delayed_key(stream))
    return sum(int(n) for n in pipe.execute())
