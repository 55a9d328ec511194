"""A queue split into partition streams: the same interface as ``StreamQueue``, over N of them.

Each partition is one ``StreamQueue`` on its own hash-tagged stream (``plaita.store.keyspace``),
so every script and transaction stays in one slot and Redis Cluster spreads the partitions over
its masters. Message ids the worker sees are qualified, ``<partition>/<stream id>``: ids of
different streams can be equal, and each ack, renewal or hand-back must reach its own stream.

Reading is fair: every read takes from the assigned partitions in turn without BLOCK, starting
one further along each time, so a busy partition cannot starve the others (after an empty read,
one pipelined sweep asks them all at once, the batch shared out); when all are empty it blocks on
one partition (in turn) for a share of ``block_ms``, so a new task anywhere waits at most about
``block_ms / partitions`` and an idle worker still stops at once (the read is cut like any other).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import redis

from plaita.config import Settings
from plaita.store.client import clients_for, interrupt
from plaita.store.keyspace import Keyspace, hash_tag
from plaita.store.streams.entries import DeadLetter, Entry, ReplicationLagError, parse_read
from plaita.store.streams.levels import FairOrder, LeveledQueue, qualify_level
from plaita.store.streams.queue import StreamQueue
from plaita.tasks import encode_body

#: Shortest BLOCK of one partition's read while all are empty.
MIN_BLOCK_MS = 20

T = TypeVar("T")
#: A partition's place in a claim cursor once it reached the end of its pending list this round.
_DONE = "$"


def keyspace_of(settings: Settings) -> Keyspace:
    return Keyspace(settings.queue_name, settings.partitions, settings.tagged_keys, settings.dlq_key)


def open_queue(
    settings: Settings, *, client: redis.Redis | None = None, read_client: redis.Redis | None = None
) -> StreamQueue:
    """The queue of ``settings``: a plain ``StreamQueue`` for one untagged partition (today's keys),
    else a ``PartitionedQueue``. Clients are made from the settings unless given."""
    if not settings.tagged_keys:
        return LeveledQueue.from_settings(settings, client=client, read_client=read_client)
    client, read_client = clients_for(settings, client, read_client)
    return PartitionedQueue(
        client,
        keyspace=keyspace_of(settings),
        read_client=read_client,
        group=settings.consumer_group,
        consumer=settings.consumer_name,
        dlq_max_len=settings.dlq_max_len,
        assigned=settings.partitions_assigned,
    )


def _partition_queue(
    client: redis.Redis,
    read_client: redis.Redis | None,
    ks: Keyspace,
    p: int,
    *,
    group: str,
    consumer: str,
    dlq_max_len: int,
) -> LeveledQueue:
    """Partition ``p``'s own queue: its stream, its priority levels', DLQ and lease keys all under
    its hash tag."""
    return LeveledQueue(
        client,
        read_client=read_client,
        stream=ks.stream(p),
        group=group,
        consumer=consumer,
        dlq_key=ks.dlq(p),
        dlq_max_len=dlq_max_len,
        lease_prefix=ks.lease_prefix(p),
        id_prefix=f"{p}/",
    )


class PartitionedQueue(StreamQueue):
    """N partition streams behind the ``StreamQueue`` interface (every method is overridden)."""

    def __init__(
        self,
        client: redis.Redis,
        *,
        keyspace: Keyspace,
        group: str,
        consumer: str,
        dlq_max_len: int,
        read_client: redis.Redis | None = None,
        assigned: Iterable[int] | None = None,
    ) -> None:
        ks = keyspace
        self.parts = [
            _partition_queue(client, read_client, ks, p, group=group, consumer=consumer, dlq_max_len=dlq_max_len)
            for p in range(ks.partitions)
        ]
        first = self.parts[0]
        super().__init__(
            client,
            read_client=first.read_client,
            stream=first.stream,
            group=group,
            consumer=consumer,
            dlq_key=first.dlq_key,
            dlq_max_len=dlq_max_len,
        )
        self.keyspace = ks
        # What logs and admin output name: the queue, not partition 0's stream.
        self.stream = f"{ks.queue} ({ks.partitions} partition{'s' * (ks.partitions > 1)})"
        self.dlq_key = f"{ks.dlq(0)} …" if ks.partitions > 1 else ks.dlq(0)
        self.assigned = sorted(set(assigned)) if assigned is not None else list(range(ks.partitions))
        self._turn = 0
        self._fair = FairOrder()
        #: The last read found nothing: the next sweep is pipelined (cheap while idle).
        self._idle = True

    def partition_queues(self) -> list[StreamQueue]:
        return list(self.parts)

    def stream_for(self, priority: int = 0) -> str:
        raise ValueError("a partitioned queue has one stream per partition: ask partition_queues()[p].stream_for")

    # -- helpers ---------------------------------------------------------------------------
    def _rotation(self) -> list[int]:
        """The assigned partitions, starting one further along each call (fairness)."""
        self._turn = (self._turn + 1) % len(self.assigned)
        return self.assigned[self._turn :] + self.assigned[: self._turn]

    def _qualified(self, p: int, entries: list[Entry]) -> list[Entry]:
        return [dataclasses.replace(e, message_id=f"{p}/{e.message_id}") for e in entries]

    def _split(self, ids: Iterable[str]) -> dict[int, list[str]]:
        out: dict[int, list[str]] = {}
        for qualified in ids:
            p, mid = self.keyspace.unqualify(qualified)
            out.setdefault(p, []).append(mid)
        return out

    def _releases_by_partition(self, releases: Iterable[tuple[str, str]]) -> dict[int, list[tuple[str, str]]]:
        """(lease key, value) pairs by the partition of the key's hash tag."""
        out: dict[int, list[tuple[str, str]]] = {}
        for key, value in releases:
            tag = hash_tag(key)
            out.setdefault(self.keyspace.tags.index(tag) if tag in self.keyspace.tags else 0, []).append((key, value))
        return out

    def _each(self, fn: Callable[[StreamQueue], T], partitions: Iterable[int] | None = None) -> list[T]:
        return [fn(self.parts[p]) for p in (self.assigned if partitions is None else partitions)]

    # -- group and produce -----------------------------------------------------------------
    def ensure_group(self) -> bool:
        """Create the group on every assigned partition; True if any was missing."""
        return any(self._each(lambda q: q.ensure_group()))  # each partition's own: its levels too

    def partition_for(self, body: dict[str, Any]) -> int:
        """The body's execution's partition; a task without one goes by its JSON text."""
        eid = body.get("execution_id")
        if isinstance(eid, str) and eid:
            return self.keyspace.partition_of(eid)
        return self.keyspace.partition_of(encode_body(body))

    def enqueue(self, body: dict[str, Any], *, schema_version: int = 1, priority: int = 0) -> str:
        p = self.partition_for(body)
        return f"{p}/{self.parts[p].enqueue(body, schema_version=schema_version, priority=priority)}"

    def enqueue_many(
        self,
        bodies: list[dict[str, Any]],
        *,
        schema_version: int = 1,
        wait_replicas: int = 0,
        wait_timeout_ms: int = 1000,
        priority: int = 0,
    ) -> list[str]:
        """One pipeline per partition (each with its own WAIT); ids in the order of ``bodies``."""
        groups: dict[int, list[int]] = {}
        for i, body in enumerate(bodies):
            groups.setdefault(self.partition_for(body), []).append(i)
        out = [""] * len(bodies)
        lagging: list[ReplicationLagError] = []
        for p, members in groups.items():
            try:
                ids = self.parts[p].enqueue_many(
                    [bodies[i] for i in members],
                    schema_version=schema_version,
                    wait_replicas=wait_replicas,
                    wait_timeout_ms=wait_timeout_ms,
                    priority=priority,
                )
            except ReplicationLagError as exc:  # added, not proven: the other partitions still go
                lagging.append(exc)
                ids = exc.ids
            for i, mid in zip(members, ids, strict=True):
                out[i] = f"{p}/{mid}"
        if lagging:
            raise ReplicationLagError(out, min(e.acked for e in lagging), wait_replicas)
        return out

    # -- consume ---------------------------------------------------------------------------
    def read_new(self, count: int, block_ms: int) -> list[Entry]:
        """Up to ``count`` new entries from the assigned partitions, starting one further along
        each call; when all are empty, a BLOCK on one partition in turn for a share of ``block_ms``.
        ``block_ms`` 0 never blocks, as on a plain queue: the read ahead of a batch still waiting
        for its leases (``ConsumePhases._read_ahead``) must not hold that batch up."""
        order = self._rotation()
        levels = sorted({lv for p in order for lv in self.parts[p].refresh_levels()}, reverse=True)
        if levels:
            out = self._sweep_levels(order, self._fair.next([*levels, 0]), count)
        else:
            out = self._sweep_pipelined([(p, 0) for p in order], count) if self._idle else self._sweep(order, count)
        if not out and block_ms > 0:
            share_ms = max(MIN_BLOCK_MS, block_ms // len(order))
            out = self._qualified(order[0], self.parts[order[0]].read_new(count, share_ms))
        self._idle = not out
        return out

    def _sweep_levels(self, order: list[int], levels: list[int], count: int) -> list[Entry]:
        """Priorities in use: level by level in ``levels``' order (``FairOrder``), each across the
        partitions in turn, so a level 9 task of any partition goes before level 0 of every one.
        After an empty read, one pipelined sweep of every partition per level instead, until a
        level has entries (an idle worker's poll costs one round trip per level in use)."""
        in_use = {p: {0, *self.parts[p].levels_in_use()} for p in order}
        if self._idle:
            for level in levels:
                found = self._sweep_pipelined([(p, level) for p in order if level in in_use[p]], count)
                if found:
                    return found
            return []
        pairs = [(p, level) for level in levels for p in order if level in in_use[p]]
        out: list[Entry] = []
        for p, level in pairs:
            if len(out) >= count:
                break
            out += self._qualified(p, self.parts[p].read_level(level, count - len(out)))
        return out

    def _sweep(self, order: list[int], count: int) -> list[Entry]:
        """Busy: partition after partition until ``count`` (a full batch is one round trip)."""
        out: list[Entry] = []
        for p in order:
            if len(out) >= count:
                break
            out += self._qualified(p, self.parts[p].read_new(count - len(out), 0))
        return out

    def _sweep_pipelined(self, pairs: list[tuple[int, int]], count: int) -> list[Entry]:
        """Idle: every (partition, level) stream at once, the batch shared out in ``pairs``' order
        (one round trip per server: an idle worker polls every partition once per BLOCK share, so
        this is most of its cost)."""
        quotas = [count // len(pairs) + (1 if i < count % len(pairs) else 0) for i in range(len(pairs))]
        wanted = [(p, level, n) for (p, level), n in zip(pairs, quotas, strict=True) if n > 0]
        pipe = self.read_client.pipeline(transaction=False)
        for p, level, n in wanted:
            pipe.xreadgroup(self.group, self.consumer, {self.parts[p].level_queue(level).stream: ">"}, count=n)
        out: list[Entry] = []
        for (p, level, _), reply in zip(wanted, pipe.execute(), strict=True):
            out += self._qualified(p, qualify_level(level, parse_read(reply)))
        return out

    def read_own_pending(self, after_id: str, count: int) -> list[Entry]:
        """A page of our own pending entries: partition by partition, in order; the cursor is the
        last qualified id returned ("0" = from the start); empty once every partition is done."""
        if after_id == "0":
            index, cursor = 0, "0"
        else:
            p, cursor = self.keyspace.unqualify(after_id)
            index = self.assigned.index(p)
        for p in self.assigned[index:]:
            page = self.parts[p].read_own_pending(cursor, count)
            if page:
                return self._qualified(p, page)
            cursor = "0"
        return []

    def delivery_counts(self, ids: list[str], *, consumer: str | None = None) -> dict[str, int]:
        out: dict[str, int] = {}
        for p, mids in self._split(ids).items():
            for mid, n in self.parts[p].delivery_counts(mids, consumer=consumer).items():
                out[f"{p}/{mid}"] = n
        return out

    def settle(
        self, acks: list[str], dead: list[DeadLetter], releases: list[tuple[str, str]] | None = None
    ) -> list[tuple[DeadLetter, str]]:
        """One MULTI/EXEC per partition: acks, dead letters and the releases of its executions'
        leases (they share its hash tag) stay atomic together."""
        by_ack = self._split(acks)
        by_dead: dict[int, list[tuple[DeadLetter, DeadLetter]]] = {}
        for d in dead:
            p, mid = self.keyspace.unqualify(d.message_id)
            by_dead.setdefault(p, []).append((d, dataclasses.replace(d, message_id=mid)))
        by_release = self._releases_by_partition(releases or [])
        refused: list[tuple[DeadLetter, str]] = []
        for p in sorted(set(by_ack) | set(by_dead) | set(by_release)):
            originals = {id(local): d for d, local in by_dead.get(p, [])}
            locals_ = [local for _, local in by_dead.get(p, [])]
            for local, error in self.parts[p].settle(by_ack.get(p, []), locals_, by_release.get(p, [])):
                refused.append((originals[id(local)], error))
        return refused

    def claim_unleased(
        self, cursor: str, min_idle_ms: int, count: int, *, dead_ms: int = 0
    ) -> tuple[str, list[Entry], int]:
        """One bounded step on every assigned partition not yet through its pending list
        (``count`` shared out; ``dead_ms`` as ``StreamQueue.claim_unleased``). The cursor holds
        each partition's own (``$`` = through this round) and is ``0-0`` once every partition
        reached the end of its list."""
        cursors = cursor.split("|")[1:] if cursor.startswith("p|") else []
        if len(cursors) != len(self.assigned):
            cursors = ["0-0"] * len(self.assigned)
        claimed: list[Entry] = []
        skipped = 0
        open_ = [i for i, c in enumerate(cursors) if c != _DONE]
        for k, i in enumerate(open_):
            left = max(0, count - sum(1 for e in claimed if not _dead(e, dead_ms)))
            if left <= 0 and not dead_ms:
                break  # the budget is spent: the rest continue from their cursors next time
            # What is left, shared over the partitions still to go (0: only dead consumers' entries).
            share = -(-left // (len(open_) - k))
            p = self.assigned[i]
            after, entries, n = self.parts[p].claim_unleased(cursors[i], min_idle_ms, share, dead_ms=dead_ms)
            cursors[i] = _DONE if after == "0-0" else after
            claimed += self._qualified(p, entries)
            skipped += n
        if all(c == _DONE for c in cursors):
            return "0-0", claimed, skipped
        return "p|" + "|".join(cursors), claimed, skipped

    def renew_pending(self, ids: list[str]) -> list[str]:
        renewed: list[str] = []
        for p, mids in self._split(ids).items():
            renewed += [f"{p}/{mid}" for mid in self.parts[p].renew_pending(mids)]
        return renewed

    def recount_own(self, counts: dict[str, int]) -> list[str]:
        done: list[str] = []
        for p, mids in self._split(counts).items():
            own = {mid: counts[f"{p}/{mid}"] for mid in mids}
            done += [f"{p}/{mid}" for mid in self.parts[p].recount_own(own)]
        return done

    def supports_xnack(self) -> bool:
        return self.parts[0].supports_xnack()

    def hand_back(
        self,
        entries: list[tuple[str, dict[str, bytes]]],
        releases: list[tuple[str, str]],
        *,
        timeout_s: float | None = 0.3,
    ) -> None:
        by_entry: dict[int, list[tuple[str, dict[str, bytes]]]] = {}
        for qualified, fields in entries:
            p, mid = self.keyspace.unqualify(qualified)
            by_entry.setdefault(p, []).append((mid, fields))
        by_release = self._releases_by_partition(releases)
        xnack = self.supports_xnack()  # asked once, not once per partition while stopping
        failure: Exception | None = None
        for p in sorted(set(by_entry) | set(by_release)):
            self.parts[p]._xnack = xnack
            try:
                self.parts[p].hand_back(by_entry.get(p, []), by_release.get(p, []), timeout_s=timeout_s)
            except Exception as exc:  # one master down: the other partitions still get theirs back
                failure = failure or exc
        if failure is not None:
            raise failure

    def prune_consumers(self, idle_ms: int) -> list[str]:
        removed: set[str] = set()
        for names in self._each(lambda q: q.prune_consumers(idle_ms)):
            removed.update(names)
        return sorted(removed)

    def sweep_residue(self, batch: int) -> int:
        return sum(self._each(lambda q: q.sweep_residue(batch)))

    def move_due(self, now_ms: int) -> int:
        """Each assigned partition's due delayed tasks onto its own stream (one script each)."""
        return sum(self._each(lambda q: q.move_due(now_ms)))

    def interrupt_read(self) -> None:
        interrupt(self.owner)

    def close(self) -> None:
        self.parts[0].close()


def _dead(entry: Entry, dead_ms: int) -> bool:
    """Claimed from a consumer silent ``dead_ms`` or more: it does not count toward a claim's budget."""
    return dead_ms > 0 and entry.owner_idle_ms is not None and entry.owner_idle_ms >= dead_ms
