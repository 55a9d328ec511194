"""Priorities: levels 1..9 as streams beside a queue's stream, read higher first, none starved.

Level 0 (the default) is the stream itself: a producer that never asks for a priority writes
exactly today's keys and entries. Level L > 0 is the stream ``<stream>:prio<L>`` with its own
delayed set ``<stream>:prio<L>:delayed`` (``plaita.store.keyspace.level_stream``), beside the
stream and under its hash tag, so every per-partition script (leases, claims, dead letters, the
delayed move) stays in one slot on Redis Cluster. Same group, consumer name, DLQ and lease keys:
a lease names the execution, never its level. A producer adds L to the set
``<stream>:prio-levels`` when it first uses L (again every ``ANNOUNCE_EVERY_S``); workers read
that set every ``LEVELS_REFRESH_S`` and create the group on a new level's stream (id 0).

Ids: a level-L entry is ``<L>/<stream id>`` (``3/9/<id>`` in partition 3), so each ack, renewal,
hand-back, claim and dead letter reaches its own stream (``plaita.store.keyspace.split_level``).

The reading rule. Each read fills its batch from the highest level down (9, …, 1, 0) without
BLOCK; one read in every ``FAIR_EVERY`` instead starts at the next level of a round robin over
the levels in use (then the rest, highest first). So a level with a backlog is served by at
least one read in every ``FAIR_EVERY × (levels in use)``, however busy the levels above it.
When every level was empty, one XREADGROUP BLOCKs on all of them at once (the batch shared out,
a surplus handed back: only streams filled at the same moment give one), so a new task at any
level wakes the worker and a stop cuts the read.

Cost: with no level in use a read is today's single XREADGROUP; the worker adds one SMEMBERS
per ``LEVELS_REFRESH_S`` (and per partition). With levels in use a read is one round trip:
``read_levels-n.lua`` (XREADGROUP level after level inside one script); an idle worker adds the
BLOCKing read after it (two round trips per BLOCK instead of one). Partitioned, a busy read tries
level after level across the partitions (one round trip each until the batch is full), an idle
one pipelines each level's partitions.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any, cast

import redis

from plaita.store import scripts
from plaita.store.errors import refused_by_acl
from plaita.store.keyspace import check_priority, level_stream, levels_key, split_level
from plaita.store.leases import RELEASE_MANY
from plaita.store.streams.entries import (
    DeadLetter,
    Entry,
    ReplicationLagError,
    as_text,
    parse_read,
    refused_dead_letters,
)
from plaita.store.streams.queue import DEAD_LETTER, StreamQueue

logger = logging.getLogger(__name__)

#: One read in this many starts at the next level of the round robin (the rule against starvation).
FAIR_EVERY = 4
#: How often a worker reads which levels are in use.
LEVELS_REFRESH_S = 1.0
#: How often a producer adds a level it uses to the set again (the set survives a flush this late).
ANNOUNCE_EVERY_S = 60.0
_READ_LEVELS = scripts.script("read_levels")
#: Separates the level from its own cursor in a claim cursor (``<L>@<cursor>``).
_AT = "@"


def qualify_level(level: int, entries: list[Entry]) -> list[Entry]:
    """``entries`` of ``level``'s stream with their ids as the queue names them (``<L>/<id>``; level 0 as is)."""
    if level == 0:
        return entries
    return [dataclasses.replace(e, message_id=f"{level}/{e.message_id}") for e in entries]


def _by_level(ids: list[str]) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for mid in ids:
        level, local = split_level(mid)
        out.setdefault(level, []).append(local)
    return out


def _leveled(ids: list[str]) -> bool:
    """Any id of a level > 0 (a stream id never holds ``/``)."""
    return any("/" in mid for mid in ids)


class FairOrder:
    """The order of levels of each read: highest first, one read in ``FAIR_EVERY`` starting at the
    next level of a round robin over the levels in use (lowest first)."""

    def __init__(self) -> None:
        self.reads = 0
        self.turn = 0

    def next(self, highest_first: list[int]) -> list[int]:
        self.reads += 1
        if self.reads % FAIR_EVERY:
            return highest_first
        start = highest_first[::-1][self.turn % len(highest_first)]
        self.turn += 1
        return [start, *(level for level in highest_first if level != start)]


class LeveledQueue(StreamQueue):
    """One stream (a partition's, or the whole queue's) with its priority levels."""

    def __init__(self, client: redis.Redis, **options: Any) -> None:
        super().__init__(client, **options)
        #: Level -> its queue; replaced whole, never changed in place (other threads iterate it).
        self._levels: dict[int, StreamQueue] = {}
        self._grouped: set[int] = set()
        self._levels_read_at_s = float("-inf")
        self._announced_at_s: dict[int, float] = {}
        self._fair = FairOrder()
        self._smembers_refused = False

    # -- levels ------------------------------------------------------------------------------
    def level_queue(self, level: int) -> StreamQueue:
        """The queue of ``level``'s stream (this one for 0)."""
        return self._level(level)

    def _level(self, level: int) -> StreamQueue:
        if level == 0:
            return self
        q = self._levels.get(level)
        if q is None:
            q = StreamQueue(
                self.client,
                read_client=self.read_client,
                stream=level_stream(self.stream, level),
                group=self.group,
                consumer=self.consumer,
                dlq_key=self.dlq_key,
                dlq_max_len=self.dlq_max_len,
                lease_prefix=self.lease_prefix,
                id_prefix=f"{self.id_prefix}{level}/",
            )
            self._levels = {**self._levels, level: q}
        return q

    def refresh_levels(self, *, force: bool = False) -> list[int]:
        """The levels > 0 in use, highest first; the set is read again when ``force`` or
        ``LEVELS_REFRESH_S`` passed. A user without SMEMBERS (an ACL from before priorities)
        is said once, and reads level 0 only."""
        now_s = time.monotonic()
        if (force or now_s - self._levels_read_at_s >= LEVELS_REFRESH_S) and not self._smembers_refused:
            self._levels_read_at_s = now_s
            try:
                members = cast(set[Any], self.owner.smembers(levels_key(self.stream)))
            except redis.ResponseError as exc:
                if not refused_by_acl(exc):
                    raise
                self._smembers_refused = True
                logger.warning("priority levels of %s not read: %s (add +smembers)", self.stream, exc)
                members = set()
            for raw in members:
                text = as_text(raw)
                if text.isdigit() and 1 <= int(text) <= 9:
                    self._level(int(text))
        return sorted(self._levels, reverse=True)

    def _in_use(self) -> list[int]:
        """``refresh_levels``, each new level's group created (the owner thread only)."""
        levels = self.refresh_levels()
        for level in levels:
            if level not in self._grouped:
                self._levels[level].ensure_group()
                self._grouped.add(level)
        return levels

    def level_queues(self) -> list[StreamQueue]:
        levels = self.refresh_levels(force=True)
        return [self, *(self._levels[level] for level in reversed(levels))]

    def stream_for(self, priority: int = 0) -> str:
        """The stream of ``priority`` (ValueError unless an int 0..9); a level > 0 is announced."""
        level = check_priority(priority)
        if level:
            self.announce(level)
        return self._level(level).stream

    def announce(self, level: int) -> None:
        """SADD ``level`` to the set workers read, once per ``ANNOUNCE_EVERY_S`` per process."""
        now_s = time.monotonic()
        if now_s - self._announced_at_s.get(level, float("-inf")) >= ANNOUNCE_EVERY_S:
            self.client.sadd(levels_key(self.stream), level)
            self._announced_at_s[level] = now_s

    # -- group and produce -------------------------------------------------------------------
    def ensure_group(self) -> bool:
        """The group on the stream and on every level in use; True if any was missing."""
        created = super().ensure_group()
        for level in self.refresh_levels(force=True):
            created = self._levels[level].ensure_group() or created
            self._grouped.add(level)
        return created

    def enqueue(self, body: dict[str, Any], *, schema_version: int = 1, priority: int = 0) -> str:
        if not priority:
            return super().enqueue(body, schema_version=schema_version)
        self.stream_for(priority)
        return f"{priority}/{self._level(priority).enqueue(body, schema_version=schema_version)}"

    def enqueue_many(
        self,
        bodies: list[dict[str, Any]],
        *,
        schema_version: int = 1,
        wait_replicas: int = 0,
        wait_timeout_ms: int = 1000,
        priority: int = 0,
    ) -> list[str]:
        level = check_priority(priority)
        if level:
            self.announce(level)

        def qualified(ids: list[str]) -> list[str]:
            return [f"{level}/{mid}" for mid in ids] if level else ids

        try:
            ids = StreamQueue.enqueue_many(
                self._level(level),
                bodies,
                schema_version=schema_version,
                wait_replicas=wait_replicas,
                wait_timeout_ms=wait_timeout_ms,
            )
        except ReplicationLagError as exc:  # its ids name their level too (what plaita enqueue prints)
            raise ReplicationLagError(qualified(exc.ids), exc.acked, exc.wanted) from None
        return qualified(ids)

    # -- consume -----------------------------------------------------------------------------
    def read_new(self, count: int, block_ms: int) -> list[Entry]:
        """Higher levels first, one read in ``FAIR_EVERY`` fair (see the module's rule)."""
        levels = self._in_use()
        if not levels:
            return super().read_new(count, block_ms)
        order = self._fair.next([*levels, 0])
        # The sweep first even when idle: a BLOCKing read over several ready streams would share
        # its batch over them, not take the highest level first.
        out = self._sweep(order, count)
        if not out and block_ms > 0:
            out = self._read_blocking(order, count, block_ms)
        return out

    def levels_in_use(self) -> list[int]:
        """The levels > 0 in use, highest first (``refresh_levels`` at most every ``LEVELS_REFRESH_S``),
        each one's group made (the owner thread only)."""
        return self._in_use()

    def read_level(self, level: int, count: int) -> list[Entry]:
        """Up to ``count`` new entries of ``level`` (no BLOCK), their ids qualified; [] for a level not in use."""
        if level and level not in self._levels:
            return []
        return qualify_level(level, StreamQueue.read_new(self._level(level), count, 0))

    def _sweep(self, order: list[int], count: int) -> list[Entry]:
        """The levels in ``order`` until ``count``, in one script call (one round trip)."""
        keys = [self._level(level).stream for level in order]
        reply = cast(list[Any], _READ_LEVELS(self.read_client, keys, [self.group, self.consumer, count]))
        out: list[Entry] = []
        for index, items in zip(reply[::2], reply[1::2], strict=True):
            level = order[int(index) - 1]
            out += qualify_level(level, parse_read([(None, items)]))
        return out

    def _read_blocking(self, order: list[int], count: int, block_ms: int) -> list[Entry]:
        """One XREADGROUP BLOCKing on every level's stream; at most ``count`` kept, highest first
        (only a read that found several streams ready at once can get more: handed back)."""
        names = {self._level(level).stream: level for level in order}
        share = max(1, count // len(order))
        streams: dict[Any, Any] = dict.fromkeys(names, ">")
        reply = self.read_client.xreadgroup(self.group, self.consumer, streams, count=share, block=block_ms)
        if not reply:
            return []
        pairs = reply.items() if isinstance(reply, dict) else reply
        found: list[tuple[int, list[Entry]]] = []
        for name, items in pairs:
            level = names[as_text(name)]
            found.append((level, qualify_level(level, parse_read([(name, items)]))))
        found.sort(key=lambda pair: -pair[0])
        out = [e for _, entries in found for e in entries]
        surplus = [(e.message_id, e.fields) for e in out[count:] if e.fields is not None]
        if surplus:
            self.hand_back(surplus, [], timeout_s=None)
        return out[:count] + [e for e in out[count:] if e.fields is None]

    def read_own_pending(self, after_id: str, count: int) -> list[Entry]:
        """A page of our own pending entries, level 0 then each level up; the cursor is the last
        id returned ("0" = from the start)."""
        levels = self._in_use()
        if not levels:
            return super().read_own_pending(after_id, count)
        order = [0, *reversed(levels)]
        level, cursor = (0, "0") if after_id == "0" else split_level(after_id)
        for at in order[order.index(level) if level in order else 0 :]:
            page = StreamQueue.read_own_pending(self._level(at), cursor, count)
            if page:
                return qualify_level(at, page)
            cursor = "0"
        return []

    def delivery_counts(self, ids: list[str], *, consumer: str | None = None) -> dict[str, int]:
        if not _leveled(ids):
            return super().delivery_counts(ids, consumer=consumer)
        out: dict[str, int] = {}
        for level, mids in _by_level(ids).items():
            counts = StreamQueue.delivery_counts(self._level(level), mids, consumer=consumer)
            out.update({(f"{level}/{mid}" if level else mid): n for mid, n in counts.items()})
        return out

    # -- settle ------------------------------------------------------------------------------
    def settle(
        self, acks: list[str], dead: list[DeadLetter], releases: list[tuple[str, str]] | None = None
    ) -> list[tuple[DeadLetter, str]]:
        """As ``StreamQueue.settle``, every level's acks and dead letters and the releases in one
        MULTI/EXEC (the level streams share the partition's slot)."""
        if not _leveled(acks) and not _leveled([d.message_id for d in dead]):
            return super().settle(acks, dead, releases)
        now_s = time.time()
        local: list[tuple[StreamQueue, DeadLetter, str]] = []
        for d in dead:
            level, mid = split_level(d.message_id)
            q = self._level(level)
            one = dataclasses.replace(d, message_id=mid)
            local.append((q, one, q._envelope(one, now_s)))

        def build(pipe: Any) -> None:
            for q, one, envelope in local:
                q.queue_dead_letters(pipe, [one], [envelope])
            for level, mids in _by_level(acks).items():
                self._level(level).queue_acks(pipe, mids)
            if releases:
                RELEASE_MANY.queue(pipe, [k for k, _ in releases], [v for _, v in releases])

        results = scripts.execute(
            self.client, build, [DEAD_LETTER, RELEASE_MANY], transaction=True, raise_on_error=False
        )
        return refused_dead_letters(results, dead)

    def claim_unleased(
        self, cursor: str, min_idle_ms: int, count: int, *, dead_ms: int = 0
    ) -> tuple[str, list[Entry], int]:
        """One bounded step on one level at a time, highest first; the cursor is ``<L>@<its
        cursor>`` while levels are left, ``0-0`` once the last (level 0) reached its end."""
        levels = self._in_use()
        if not levels and _AT not in cursor:
            return super().claim_unleased(cursor, min_idle_ms, count, dead_ms=dead_ms)
        order = [*levels, 0]
        if _AT in cursor:
            head, inner = cursor.split(_AT, 1)
            level = int(head) if head.isdigit() else 0
        else:
            level, inner = (order[0], "0-0") if cursor in ("0", "0-0") else (0, cursor)
        after, entries, skipped = StreamQueue.claim_unleased(
            self._level(level), inner, min_idle_ms, count, dead_ms=dead_ms
        )
        if after != "0-0":
            return f"{level}{_AT}{after}", qualify_level(level, entries), skipped
        rest = order[order.index(level) + 1 :] if level in order else []
        return (f"{rest[0]}{_AT}0-0" if rest else "0-0"), qualify_level(level, entries), skipped

    def renew_pending(self, ids: list[str]) -> list[str]:
        if not _leveled(ids):
            return super().renew_pending(ids)
        out: list[str] = []
        for level, mids in _by_level(ids).items():
            done = StreamQueue.renew_pending(self._level(level), mids)
            out += [f"{level}/{mid}" for mid in done] if level else done
        return out

    def recount_own(self, counts: dict[str, int]) -> list[str]:
        if not _leveled(list(counts)):
            return super().recount_own(counts)
        out: list[str] = []
        for level, mids in _by_level(list(counts)).items():
            prefix = f"{level}/" if level else ""
            done = StreamQueue.recount_own(self._level(level), {mid: counts[prefix + mid] for mid in mids})
            out += [prefix + mid for mid in done]
        return out

    def _queue_returns(self, pipe: Any, entries: list[tuple[str, dict[str, bytes]]]) -> None:
        """Each level's entries back to its own stream, all in the one MULTI ``hand_back`` sends
        (with the lease releases): a failure hands back none, so the settler's retry of the
        batch cannot re-add an entry twice. The levels share the stream's slot."""
        if not _leveled([mid for mid, _ in entries]):
            super()._queue_returns(pipe, entries)
            return
        by_level: dict[int, list[tuple[str, dict[str, bytes]]]] = {}
        for mid, fields in entries:
            level, local = split_level(mid)
            by_level.setdefault(level, []).append((local, fields))
        xnack = self.supports_xnack()
        for level, local_entries in sorted(by_level.items()):
            q = self._level(level)
            q._xnack = xnack
            StreamQueue._queue_returns(q, pipe, local_entries)

    # -- housekeeping ------------------------------------------------------------------------
    def prune_consumers(self, idle_ms: int) -> list[str]:
        removed = set(super().prune_consumers(idle_ms))
        for level in self._in_use():
            removed.update(self._levels[level].prune_consumers(idle_ms))
        return sorted(removed)

    def sweep_residue(self, batch: int) -> int:
        return super().sweep_residue(batch) + sum(self._levels[lv].sweep_residue(batch) for lv in self._in_use())

    def move_due(self, now_ms: int) -> int:
        """Due delayed tasks of level 0 and of each level in use, each onto its own stream."""
        return super().move_due(now_ms) + sum(self._levels[lv].move_due(now_ms) for lv in self._in_use())
