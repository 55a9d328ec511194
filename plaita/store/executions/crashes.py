"""Crash strikes: how often a task was in flight when its worker process died, kept in Redis.

A worker that finds tasks its predecessor had in flight (``plaita.runtime.suspects``) cannot tell
which of them killed it; it runs them one at a time. Each one's hash
``plaita:execution:crashes:<id>`` (per execution id, or per message id for a task without one; in
the tenant's namespace and the partition's hash tag) holds ``count`` (crashes counted against it)
and ``armed`` (the message id of the entry running alone now). Before a suspect runs alone,
``turn`` counts the crash it was in flight for (the first one, shared with every task beside it,
counts once; a *lone* suspect, the only entry its predecessor had pending, is blamed for it at
once) and arms the record with its message id; when it ends, ``clear`` deletes the record.
A successor that finds the record still armed with the same message id knows the process died
while that entry ran alone: that crash is blamed on it. A handed-back entry comes back under a
new message id, so a graceful stop never counts. The record survives a replacement worker under
another consumer name (it is keyed by the task, not the consumer) and expires after
``CRASH_STRIKES_TTL_S`` untouched.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import redis

from plaita.store import scripts
from plaita.store.client import bounded_clone, close_clone
from plaita.store.errors import error_code
from plaita.store.keyspace import Keyspace
from plaita.store.streams.entries import as_text

logger = logging.getLogger(__name__)

#: A crash-strike record untouched this long is dropped (a day: far beyond any restart loop).
CRASH_STRIKES_TTL_S = 24 * 3600

_CRASH_TURN = scripts.script("crash_turn")
#: Prefix of ``clean_stop_key`` (a platform key: not per tenant).
CLEAN_STOP_PREFIX = "plaita:worker:clean-stop:"


@dataclass(frozen=True, slots=True)
class Turn:
    """What ``CrashStrikes.turn`` found: the crashes counted against the task, and whether the
    last one happened while it ran alone (then it is blamed on it for sure)."""

    count: int
    blamed: bool


class CrashStrikes:
    """Reads and writes the crash-strike records of one queue's tasks."""

    def __init__(self, client: redis.Redis, *, ttl_s: int = CRASH_STRIKES_TTL_S) -> None:
        self.client = client
        self.ttl_ms = ttl_s * 1000

    @staticmethod
    def key(keyspace: Keyspace, name: str) -> str:
        """The record of execution id (or qualified message id) ``name`` in ``keyspace``."""
        return keyspace.crashes_key(name)

    def turn(self, key: str, message_id: str, max_crashes: int, *, lone: bool = False) -> Turn | None:
        """Count the crash a suspect was in flight for and arm its record for this run alone; the
        record is not armed again once the task has reached ``max_crashes`` with a blamed crash.
        ``lone``: the suspect was the only entry its dead predecessor had pending, so the crash is
        blamed on it at once. None when the key holds something else (WRONGTYPE): logged, the task
        runs without strikes."""
        try:
            reply = _CRASH_TURN(self.client, [key], [message_id, max_crashes, self.ttl_ms, int(lone)])
        except redis.ResponseError as exc:
            if error_code(exc) != "WRONGTYPE":
                raise
            logger.error("crash-strike key %s holds another type; task %s runs without strikes", key, message_id)
            return None
        return Turn(int(reply[0]), bool(reply[1]))

    def armed_for(self, keys: list[str], message_ids: list[str]) -> list[bool]:
        """For each task, whether its record is armed for that very entry: the process died while
        it ran alone (one pipelined read; WRONGTYPE answers False)."""
        if not keys:
            return []
        with self.client.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.hget(key, "armed")
            replies = pipe.execute(raise_on_error=False)
        return [isinstance(r, bytes | str) and as_text(r) == mid for r, mid in zip(replies, message_ids, strict=True)]

    def disarm(self, key: str, message_id: str) -> None:
        """The armed entry did not run here after all (its lease was taken): no crash to blame."""
        armed = self.client.hget(key, "armed")
        if armed is not None and as_text(armed) == message_id:
            self.client.hdel(key, "armed")

    def clear(self, key: str) -> None:
        """The task ran alone and the process lived: no strike stays against it."""
        self.client.delete(key)

    @staticmethod
    def clean_stop_key(keyspace: Keyspace, consumer: str) -> str:
        """Set by a worker that stopped gracefully with no suspect left: its successor under the
        same consumer name finds its own pending entries are no crash's (``take_clean_stop``)."""
        return keyspace.named(CLEAN_STOP_PREFIX) + keyspace.queue + ":" + consumer

    def mark_clean_stop(self, key: str, *, timeout_s: float) -> None:
        """Record a graceful stop (each round trip bounded: this runs while stopping)."""
        client = bounded_clone(self.client, timeout_s)
        try:
            client.set(key, "1", ex=CRASH_STRIKES_TTL_S)
        finally:
            close_clone(client)

    def take_clean_stop(self, key: str) -> bool:
        """True (and the mark removed) when the predecessor under this name stopped gracefully."""
        with self.client.pipeline(transaction=True) as pipe:
            pipe.get(key)
            pipe.delete(key)
            found = pipe.execute()[0]
        return found is not None

    def count(self, key: str) -> int:
        """The crashes counted against a task (0: none, or no record)."""
        raw = self.client.hget(key, "count")
        return int(raw) if raw is not None else 0
