"""StreamQueue: every stream command of a worker (read, claim, settle, hand back, housekeeping).

Every method lets redis-py exceptions through unchanged: the worker classifies them
(``plaita.store.errors``) and turns them into ``redis_failed``. Nothing here retries or
sleeps; retrying is the lifecycle's job (BACKOFF), and redis-py's own retry is switched off
so a frozen server costs one socket timeout, not ten.
"""

from __future__ import annotations

import logging
import time
from typing import Any, cast

import redis
from redis.client import Pipeline

from plaita.config import Settings
from plaita.envelope import build_envelope
from plaita.store import scripts
from plaita.store.client import bounded_clone, clients_for, close_clone, interrupt, node_client
from plaita.store.errors import refused_by_acl
from plaita.store.keyspace import LEASE_PREFIX, Keyspace
from plaita.store.leases import RELEASE_MANY
from plaita.store.streams import delayed, reclaim
from plaita.store.streams.entries import (
    DeadLetter,
    Entry,
    ReplicationLagError,
    _raw_reply,
    as_text,
    parse_read,
    raw_fields,
    refused_dead_letters,
)
from plaita.store.streams.stream_scan import stream_execution_ids
from plaita.tasks import PAYLOAD_FIELD, SCHEMA_FIELD, encode_body, field_name_bytes

logger = logging.getLogger(__name__)


#: Longest wait for each round trip of the hand-back transaction while stopping.
HAND_BACK_TIMEOUT_S = 0.3


DEAD_LETTER = scripts.script("dead_letter")
_RENEW_OWN = scripts.script("renew_own")
_RECOUNT_OWN = scripts.script("recount_own")
_PRUNE_CONSUMERS = scripts.script("prune_consumers")
_SWEEP_RESIDUE = scripts.script("sweep_residue")


class StreamQueue:
    """One stream, one consumer group, one consumer name."""

    def __init__(
        self,
        client: redis.Redis,
        *,
        stream: str,
        group: str,
        consumer: str,
        dlq_key: str,
        dlq_max_len: int,
        read_client: redis.Redis | None = None,
        lease_prefix: str = LEASE_PREFIX,
        id_prefix: str = "",
    ) -> None:
        self.client = client
        #: Lease key of an entry: ``lease_prefix`` + its execution id, or + ``id_prefix`` + its
        #: message id for a task without one (see ``plaita.store.keyspace``).
        self.lease_prefix = lease_prefix
        self.id_prefix = id_prefix
        # The owner thread's calls (reads, group, claims, housekeeping) get a pool of their own,
        # so a stop can cut exactly them (interrupt_owner) without touching acks or renewals.
        self.read_client = read_client if read_client is not None else client
        self.owner = self.read_client
        if self.read_client is not client:
            self.read_client.set_response_callback("XREADGROUP", _raw_reply)
        self.stream = stream
        self.group = group
        self.consumer = consumer
        self.dlq_key = dlq_key
        self.dlq_max_len = dlq_max_len
        self._xnack: bool | None = None
        #: The server refused the delayed move (NOPERM): said once.
        self._move_refused = False
        self.keyspace = Keyspace(stream, dlq_key=dlq_key)

    def partition_queues(self) -> list[StreamQueue]:
        """One queue per partition stream, in partition order (a plain queue is its only one)."""
        return [self]

    def partition_for(self, body: dict[str, Any]) -> int:
        """The partition a body belongs to (one partition: always 0)."""
        return 0

    @property
    def streams(self) -> list[str]:
        """Every stream of this queue: each partition's, and each of its priority levels in use."""
        return [s for q in self.partition_queues() for s in q.level_streams()]

    def level_streams(self) -> list[str]:
        """This stream and those of its priority levels in use (``plaita.store.streams.levels``)."""
        return [q.stream for q in self.level_queues()]

    def level_queues(self) -> list[StreamQueue]:
        """This queue and one per priority level in use, lowest first (a plain queue: itself)."""
        return [self]

    def stream_for(self, priority: int = 0) -> str:
        """The stream a task of ``priority`` goes to. A plain queue has level 0 only: ValueError
        for another (``open_queue`` opens one with levels)."""
        if priority:
            raise ValueError(f"queue {self.stream} has no priority levels (open it with open_queue)")
        return self.stream

    def execution_ids(self, max_entries: int) -> tuple[set[str], bool]:
        """The execution ids of every task in this queue's streams, and whether every stream was
        read within ``max_entries`` entries (``plaita.store.streams.stream_scan``)."""
        return stream_execution_ids(self.client, self.streams, max_entries)

    @classmethod
    def from_settings(
        cls, settings: Settings, *, client: redis.Redis | None = None, read_client: redis.Redis | None = None
    ) -> StreamQueue:
        """The queue of ``settings``, over the given clients or two new ones (connected lazily:
        never raises for Redis down). Without its own ``read_client`` the queue reads on ``client``."""
        client, read_client = clients_for(settings, client, read_client)
        return cls(
            client,
            read_client=read_client,
            stream=settings.queue_name,
            group=settings.consumer_group,
            consumer=settings.consumer_name,
            dlq_key=settings.dlq,
            dlq_max_len=settings.dlq_max_len,
        )

    # -- group ------------------------------------------------------------------------
    def ensure_group(self) -> bool:
        """``XGROUP CREATE <stream> <group> 0 MKSTREAM``; True if created, False if it existed."""
        try:
            self.owner.xgroup_create(self.stream, self.group, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" in str(exc):
                return False
            raise
        return True

    # -- produce ----------------------------------------------------------------------
    def enqueue(self, body: dict[str, Any], *, schema_version: int = 1, priority: int = 0) -> str:
        """XADD a task body; returns its id. ``priority``: 0 only (see ``stream_for``)."""
        self.stream_for(priority)
        fields = {PAYLOAD_FIELD: encode_body(body), SCHEMA_FIELD: str(schema_version)}
        return as_text(cast(bytes, self.client.xadd(self.stream, fields)))  # type: ignore[arg-type]

    def enqueue_many(
        self,
        bodies: list[dict[str, Any]],
        *,
        schema_version: int = 1,
        wait_replicas: int = 0,
        wait_timeout_ms: int = 1000,
        priority: int = 0,
    ) -> list[str]:
        """XADD many bodies in one pipeline; returns their ids in order. ``priority``: 0 only here.

        ``wait_replicas``: a durable enqueue. Replication is asynchronous, so a failover can lose
        entries the old master acknowledged but never sent on; WAIT makes the call return only
        once that many replicas have them (or raise ``ReplicationLagError`` after the timeout,
        when the ids are on the master but not proven on a replica).
        """
        self.stream_for(priority)
        # WAIT counts what this connection wrote: on a cluster, the XADDs and the WAIT go together
        # to the master of the stream's slot.
        client = node_client(self.client, self.stream) if wait_replicas > 0 else self.client
        pipe = client.pipeline(transaction=False)
        for body in bodies:
            pipe.xadd(self.stream, {PAYLOAD_FIELD: encode_body(body), SCHEMA_FIELD: str(schema_version)})
        if wait_replicas > 0:
            pipe.execute_command("WAIT", wait_replicas, wait_timeout_ms)  # type: ignore[no-untyped-call]
        replies = pipe.execute()
        ids = [as_text(i) for i in replies[: len(bodies)]]
        if wait_replicas > 0 and int(replies[-1]) < wait_replicas:
            raise ReplicationLagError(ids, int(replies[-1]), wait_replicas)
        return ids

    # -- consume ----------------------------------------------------------------------
    def read_new(self, count: int, block_ms: int) -> list[Entry]:
        """``XREADGROUP … COUNT count BLOCK block_ms STREAMS <stream> >``. Empty when BLOCK expires;
        ``block_ms`` 0 reads without BLOCK (not Redis's "block forever")."""
        block = block_ms if block_ms > 0 else None
        reply = self.read_client.xreadgroup(self.group, self.consumer, {self.stream: ">"}, count=count, block=block)
        return parse_read(reply)

    def read_own_pending(self, after_id: str, count: int) -> list[Entry]:
        """Re-read this consumer's own pending entries after ``after_id`` (no BLOCK).

        Redis bumps their delivery count on this read; the counts returned are the new ones.
        """
        reply = self.read_client.xreadgroup(self.group, self.consumer, {self.stream: after_id}, count=count)
        entries = parse_read(reply)
        if not entries:
            return entries
        counts = self.delivery_counts([e.message_id for e in entries], consumer=self.consumer)
        return [Entry(e.message_id, e.fields, counts.get(e.message_id, 1), e.problems) for e in entries]

    def delivery_counts(self, ids: list[str], *, consumer: str | None = None) -> dict[str, int]:
        """Delivery count of each pending id (one XPENDING range call)."""
        if not ids:
            return {}
        rows = self.owner.xpending_range(
            self.stream, self.group, min=ids[0], max=ids[-1], count=max(len(ids) * 4, 16), consumername=consumer
        )
        wanted = set(ids)
        out: dict[str, int] = {}
        for row in cast(list[dict[str, Any]], rows):
            mid = as_text(row["message_id"])
            if mid in wanted:
                out[mid] = int(row["times_delivered"])
        return out

    # -- settle -----------------------------------------------------------------------
    def settle(
        self, acks: list[str], dead: list[DeadLetter], releases: list[tuple[str, str]] | None = None
    ) -> list[tuple[DeadLetter, str]]:
        """Ack (XACK + XDEL), dead-letter and release leases in one MULTI/EXEC round trip.

        Atomic, so a lease is never released before its task's ack (no window for a second
        delivery). Each dead letter is one Lua call that adds the DLQ copy first and acks its
        source only if that succeeded: MULTI does not roll back, so a failing XADD (say the DLQ
        key holds another type) must not be followed by the ack, or the task would be lost.
        ``releases`` are (lease key, value) pairs, released only if still held with that value.
        Returns the dead letters Redis refused with a per-key error (WRONGTYPE), each with the
        error: those entries stay pending, everything else in the batch is settled. Any other
        error raises.
        """
        if not acks and not dead and not releases:
            return []
        now = time.time()
        envelopes = [self._envelope(d, now) for d in dead]

        # Safe to run twice (see plaita.store.scripts): XACK/XDEL and compare-and-delete are
        # idempotent, and a NOSCRIPT reply means no dead-letter script ran.
        def build(pipe: Pipeline) -> None:
            self.queue_dead_letters(pipe, dead, envelopes)
            self.queue_acks(pipe, acks)
            if releases:
                keys, values = zip(*releases, strict=True)  # in C, not two Python loops over the pairs
                RELEASE_MANY.queue(pipe, keys, values)

        results = scripts.execute(
            self.client, build, [DEAD_LETTER, RELEASE_MANY], transaction=True, raise_on_error=False
        )
        return refused_dead_letters(results, dead)

    def queue_dead_letters(self, pipe: Pipeline, dead: list[DeadLetter], envelopes: list[str]) -> None:
        """Queue one dead-letter script call per entry of ``dead`` (one reply each) on ``pipe``."""
        for d, envelope in zip(dead, envelopes, strict=True):
            DEAD_LETTER.queue(pipe, [self.dlq_key, self.stream], [self.group, self.dlq_max_len, d.message_id, envelope])

    def queue_acks(self, pipe: Pipeline, acks: list[str]) -> None:
        """Queue XACK + XDEL of ``acks`` on ``pipe`` (nothing for none)."""
        if acks:
            pipe.xack(self.stream, self.group, *acks)
            pipe.xdel(self.stream, *acks)

    def _envelope(self, d: DeadLetter, now: float) -> str:
        """The DLQ entry's ``payload`` field: the envelope keys DLQ readers expect (see
        ``plaita.envelope``), plus every field of the source entry exactly (base64 where not UTF-8,
        large values truncated with their size and hash)."""
        return build_envelope(
            reason=d.reason,
            source_stream=self.stream,
            source_id=d.message_id,
            delivery_count=d.delivery_count,
            dead_lettered_at=now,
            fields=None if d.fields is None else [(field_name_bytes(k), v) for k, v in d.fields.items()],
            body=d.payload,
        )

    def ack(self, *ids: str) -> None:
        """XACK + XDEL (one round trip)."""
        self.settle(list(ids), [])

    # -- lease-aware delivery ------------------------------------------------------------
    def claim_unleased(
        self, cursor: str, min_idle_ms: int, count: int, *, dead_ms: int = 0
    ) -> tuple[str, list[Entry], int]:
        """One bounded reclaim step: claim entries idle > ``min_idle_ms`` whose lease is absent,
        at most ``count`` of live consumers (``plaita.store.streams.reclaim``)."""
        return reclaim.claim_unleased(self, cursor, min_idle_ms, count, dead_ms=dead_ms)

    def renew_pending(self, ids: list[str]) -> list[str]:
        """Reset the idle time of our own pending entries (XCLAIM … JUSTID to ourselves).

        JUSTID leaves the delivery count untouched, so a long task on a live worker never looks
        abandoned and never creeps towards the poison limit.
        Only entries still owned by this consumer are touched (checked in the same Lua call),
        so a renewal never pulls back an entry a successor has claimed. Returns the ids renewed.
        """
        renewed: list[str] = []
        for start in range(0, len(ids), 500):
            reply = _RENEW_OWN(self.client, [self.stream], [self.group, self.consumer, *ids[start : start + 500]])
            renewed.extend(as_text(x) for x in reply)
        return renewed

    def recount_own(self, counts: dict[str, int]) -> list[str]:
        """Set the delivery count of our own pending entries (XCLAIM … RETRYCOUNT n JUSTID to
        ourselves), skipping any another consumer has claimed. Returns the ids set."""
        done: list[str] = []
        pairs = [str(x) for mid, n in counts.items() for x in (mid, max(1, n))]
        for start in range(0, len(pairs), 1000):
            reply = _RECOUNT_OWN(self.owner, [self.stream], [self.group, self.consumer, *pairs[start : start + 1000]])
            done.extend(as_text(x) for x in reply)
        return done

    def supports_xnack(self) -> bool:
        """True when the server has XNACK (Redis >= 8.8; not Valkey). Asked once, then cached."""
        if self._xnack is None:
            info: dict[str, Any] = self.owner.info("server")
            version = tuple(int(x) for x in str(info.get("redis_version", "0.0")).split(".")[:2] if x.isdigit())
            self._xnack = "valkey" not in str(info.get("server_name", "")).lower() and version >= (8, 8)
        return self._xnack

    def hand_back(
        self,
        entries: list[tuple[str, dict[str, bytes]]],
        releases: list[tuple[str, str]],
        *,
        timeout_s: float | None = HAND_BACK_TIMEOUT_S,
    ) -> None:
        """Give entries back to the group at once without charging a delivery.

        Uses ``XNACK … SILENT`` where the server has it; otherwise re-adds each entry (same
        fields) and acks + deletes the original, atomically. ``releases`` are (lease key,
        value) pairs released in the same transaction. Runs while stopping, so every round
        trip is bounded by ``timeout_s`` (a frozen Redis must not stretch the exit); None = the
        worker's own client and timeouts (a hand-back while running, by the settler).
        """
        if not entries and not releases:
            return
        if timeout_s is None:
            self._hand_back(self.client, entries, releases)
            return
        client = bounded_clone(self.client, timeout_s)
        try:
            self._hand_back(client, entries, releases)
        finally:
            close_clone(client)

    def _hand_back(
        self, client: redis.Redis, entries: list[tuple[str, dict[str, bytes]]], releases: list[tuple[str, str]]
    ) -> None:
        if releases:
            # Not safe to run twice (it re-adds entries): the script must be there before EXEC.
            scripts.ensure_loaded(client, [RELEASE_MANY])
        pipe = client.pipeline(transaction=True)
        self._queue_returns(pipe, entries)
        if releases:
            RELEASE_MANY.queue(pipe, [k for k, _ in releases], [v for _, v in releases])
        pipe.execute()

    def _queue_returns(self, pipe: Any, entries: list[tuple[str, dict[str, bytes]]]) -> None:
        """Queue on ``pipe`` (a MULTI) what gives ``entries`` back to this stream's group."""
        ids = [mid for mid, _ in entries]
        if ids and self.supports_xnack():
            pipe.execute_command("XNACK", self.stream, self.group, "SILENT", "IDS", len(ids), *ids)
        elif ids:
            for _mid, fields in entries:
                pipe.xadd(self.stream, raw_fields(fields))
            pipe.xack(self.stream, self.group, *ids)
            pipe.xdel(self.stream, *ids)

    def prune_consumers(self, idle_ms: int) -> list[str]:
        """Remove consumers with no pending entries idle longer than ``idle_ms`` (never us).

        Atomic in Lua: a consumer cannot read between the check and XGROUP DELCONSUMER.
        """
        removed = _PRUNE_CONSUMERS(self.owner, [self.stream], [self.group, self.consumer, idle_ms])
        return [as_text(x) for x in removed]

    def sweep_residue(self, batch: int) -> int:
        """Delete up to ``batch`` entries already acked but not deleted (a client dying between its
        XACK and XDEL leaves them, and the stream would grow without bound).

        Only entries at or below the group's last-delivered id and absent from the pending
        list are touched; the backlog and pending entries never are.
        """
        return int(_SWEEP_RESIDUE(self.owner, [self.stream], [self.group, batch]))

    def move_due(self, now_ms: int) -> int:
        """Move the delayed tasks due at ``now_ms`` onto the stream (``plaita.store.streams.delayed``).
        A Redis user without the rights (an ACL from before delays) logs once and moves nothing:
        the worker's other work goes on."""
        try:
            moved = delayed.move_due(self.owner, self.stream, now_ms)
        except redis.ResponseError as exc:
            if not refused_by_acl(exc):
                raise
            if not self._move_refused:
                self._move_refused = True
                logger.warning("delayed tasks of %s not moved: %s (add %s)", self.stream, exc, delayed.MOVE_ACL)
            return 0
        if moved < 0:
            key = delayed.delayed_key(self.stream)
            logger.warning("%s or %s holds another type: delayed tasks not moved", key, self.stream)
        return max(0, moved)

    # -- shutdown helpers -------------------------------------------------------------
    def interrupt_read(self) -> None:
        """Cut the owner's call in progress (a blocking read, or any call to a frozen server) so
        a stop is not delayed by BLOCK or a socket timeout.

        Best effort; the call then fails with ConnectionError. Entries Redis already handed to
        us stay in this consumer's pending list and are re-read on the next start.
        """
        interrupt(self.owner)

    def close(self) -> None:
        """Release every connection."""
        for c in {id(self.client): self.client, id(self.read_client): self.read_client}.values():
            try:
                c.close()
            except Exception:  # closing is best effort during shutdown
                logger.debug("closing a redis client failed", exc_info=True)
