"""StreamQueue against a real private redis-server: what each stream command wrapper does."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import pytest
import redis

from plaita.store.client import make_client
from plaita.store.streams.queue import DeadLetter, StreamQueue
from tests.support.workers import wait_for

pytestmark = pytest.mark.redis

STREAM = "plaita:test:queue"
GROUP = "plaita-workers"
DLQ = f"{STREAM}:dlq"
READER_NAME = "plaita-test-queue-reader"


def make_queue(url: str, consumer: str = "c1", *, socket_timeout_s: float = 10.0) -> StreamQueue:
    return StreamQueue(
        make_client(url, socket_timeout_s=socket_timeout_s),
        read_client=make_client(url, socket_timeout_s=socket_timeout_s, client_name=READER_NAME),
        stream=STREAM,
        group=GROUP,
        consumer=consumer,
        dlq_key=DLQ,
        dlq_max_len=10,
    )


@pytest.fixture
def q(redis_url: str) -> Iterator[StreamQueue]:
    queue = make_queue(redis_url)
    yield queue
    queue.close()


def body(n: int) -> dict[str, object]:
    return {"type": "start", "flow_id": "f", "params": {"n": n}}


class TestGroupAndEnqueue:
    """Creating the group and adding tasks."""

    def test_ensure_group_is_idempotent(self, q: StreamQueue, rclient: redis.Redis) -> None:
        """The first call creates group and stream (True); the second answers BUSYGROUP quietly (False)."""
        assert q.ensure_group() is True
        assert q.ensure_group() is False
        assert [g["name"] for g in rclient.xinfo_groups(STREAM)] == [GROUP]

    def test_enqueue_writes_payload_and_schema_version(self, q: StreamQueue, rclient: redis.Redis) -> None:
        """An entry holds ``payload`` (a JSON object) and ``schema_version`` '1'."""
        mid = q.enqueue({"type": "start", "flow_id": "é"})
        [(got_id, fields)] = rclient.xrange(STREAM)
        assert got_id == mid
        assert set(fields) == {"payload", "schema_version"}
        assert json.loads(fields["payload"]) == {"type": "start", "flow_id": "é"}
        assert fields["schema_version"] == "1"

    def test_enqueue_many_keeps_order(self, q: StreamQueue, rclient: redis.Redis) -> None:
        """enqueue_many returns the ids of the bodies in order."""
        ids = q.enqueue_many([body(1), body(2), body(3)])
        entries = rclient.xrange(STREAM)
        assert [e[0] for e in entries] == ids
        assert [json.loads(f["payload"])["params"]["n"] for _i, f in entries] == [1, 2, 3]


class TestReading:
    """Reads: new entries, BLOCK expiry, and this consumer's own pending entries."""

    def test_read_new_returns_entries_with_fields(self, q: StreamQueue, rclient: redis.Redis) -> None:
        """read_new hands out entries once, as pending for this consumer with delivery count 1."""
        q.ensure_group()
        ids = q.enqueue_many([body(1), body(2)])
        entries = q.read_new(10, 100)
        assert [e.message_id for e in entries] == ids
        assert all(e.delivery_count == 1 and e.fields is not None for e in entries)
        assert json.loads(entries[0].fields["payload"])["params"]["n"] == 1  # type: ignore[index]
        assert rclient.xpending(STREAM, GROUP)["pending"] == 2
        assert q.read_new(10, 100) == []

    def test_block_expiry_is_an_empty_list(self, q: StreamQueue) -> None:
        """An expired BLOCK returns [] (no message), not an exception, after about block_ms."""
        q.ensure_group()
        started = time.monotonic()
        assert q.read_new(1, 150) == []
        assert time.monotonic() - started >= 0.14

    def test_read_own_pending_bumps_delivery_counts(self, redis_url: str, q: StreamQueue) -> None:
        """Only this consumer's pending entries come back, after ``after_id``, with counts bumped to 2."""
        q.ensure_group()
        mine = q.enqueue_many([body(1), body(2)])
        q.read_new(10, 100)
        other = make_queue(redis_url, "c2")
        try:
            theirs = q.enqueue(body(3))
            assert [e.message_id for e in other.read_new(10, 100)] == [theirs]
        finally:
            other.close()
        entries = q.read_own_pending("0", 10)
        assert [(e.message_id, e.delivery_count) for e in entries] == [(mine[0], 2), (mine[1], 2)]
        assert [e.message_id for e in q.read_own_pending(mine[0], 10)] == [mine[1]]
        assert q.read_own_pending(mine[1], 10) == []


class TestReclaim:
    """Claiming idle entries of other consumers."""

    def test_claim_unleased_follows_the_cursor_and_skips_leased(self, q: StreamQueue, rclient: redis.Redis) -> None:
        """The worker's reclaim step claims one unleased entry per call, skips a leased one, ends at '0-0'."""
        q.ensure_group()
        ids = q.enqueue_many([body(1), body(2), body(3)])
        rclient.xreadgroup(GROUP, "gone:0", {STREAM: ">"}, count=3)
        prefix = q.lease_prefix = "plaita:test:lease:"
        rclient.set(f"{prefix}{ids[1]}", "worker:alive@1:1", px=60_000)  # ids[1]'s execution is still leased
        cursor, claimed, skipped = q.claim_unleased("0-0", 0, 1)
        assert ([(e.message_id, e.delivery_count) for e in claimed], skipped) == ([(ids[0], 2)], 0)
        cursor, claimed, skipped = q.claim_unleased(cursor, 0, 1)
        assert ([(e.message_id, e.delivery_count) for e in claimed], skipped) == ([(ids[2], 2)], 1)
        cursor, claimed, skipped = q.claim_unleased(cursor, 0, 1)
        assert (cursor, claimed, skipped) == ("0-0", [], 0)
        owners = {r["message_id"]: r["consumer"] for r in rclient.xpending_range(STREAM, GROUP, "-", "+", 10)}
        assert owners == {ids[0]: "c1", ids[1]: "gone:0", ids[2]: "c1"}


class TestSettle:
    """Acks and dead letters in one transaction."""

    def test_settle_acks_deletes_and_dead_letters(self, q: StreamQueue, rclient: redis.Redis) -> None:
        """Acked ids leave PEL and stream; the dead one also gets a DLQ envelope with its payload."""
        q.ensure_group()
        ok, dead = q.enqueue_many([body(1), body(2)])
        q.read_new(10, 100)
        q.settle([ok], [DeadLetter(dead, "unknown task type 'x'", 4, {"type": "x"})])
        assert rclient.xpending(STREAM, GROUP)["pending"] == 0
        assert rclient.xlen(STREAM) == 0
        [(_dlq_id, fields)] = rclient.xrange(DLQ)
        envelope = json.loads(fields["payload"])
        assert envelope["reason"] == "unknown task type 'x'"
        assert envelope["source_id"] == dead
        assert envelope["source_stream"] == STREAM
        assert envelope["delivery_count"] == 4
        assert envelope["payload"] == {"type": "x"}
        assert isinstance(envelope["dead_lettered_at"], float)

    def test_settle_is_one_transaction(self, redis_url: str, q: StreamQueue, rclient: redis.Redis) -> None:
        """Another client never observes the DLQ copy without the source acked (MONITOR shows MULTI/EXEC)."""
        q.ensure_group()
        mid = q.enqueue(body(1))
        q.read_new(1, 100)
        monitor_client = redis.Redis.from_url(redis_url, decode_responses=True, socket_timeout=5)
        commands: list[str] = []
        with monitor_client.monitor() as m:
            q.settle([], [DeadLetter(mid, "bad", 1, None)])
            q.client.ping()
            for event in m.listen():
                cmd = event["command"].split(" ", 1)[0].upper()
                if cmd == "PING":
                    break
                commands.append(cmd)
        monitor_client.close()
        # redis-py checks its scripts are loaded (SCRIPT EXISTS) before the transaction.
        commands = [c for c in commands if c != "SCRIPT"]
        assert commands[0] == "MULTI" and "EXEC" in commands, commands
        # The DLQ copy, its trim, the ack and the delete run inside one script in the transaction.
        assert {"EVALSHA", "XADD", "XACK", "XDEL"} <= set(commands), commands

    def test_dead_letter_that_cannot_be_written_is_not_acked(self, q: StreamQueue, rclient: redis.Redis) -> None:
        """A DLQ key of the wrong type leaves that source pending, never lost, and reports it instead
        of failing the batch: the rest is settled (one bad key must not stop all acks)."""
        q.ensure_group()
        mid = q.enqueue(body(1))
        other = q.enqueue(body(2))
        q.read_new(2, 100)
        rclient.set(q.dlq_key, "not a stream")
        refused = q.settle([other], [DeadLetter(mid, "bad", 1, None)])
        assert [(d.message_id, "WRONGTYPE" in why) for d, why in refused] == [(mid, True)]
        assert [e[0] for e in rclient.xrange(q.stream)] == [mid]  # the plain ack went through
        assert rclient.xpending(q.stream, q.group)["pending"] == 1

    def test_settle_nothing_is_a_no_op(self, q: StreamQueue) -> None:
        """Nothing to settle issues no command (and does not fail without a group)."""
        q.settle([], [])


class TestInterrupt:
    """interrupt_read cuts a blocking read so a stop is not delayed by BLOCK."""

    def test_interrupt_cuts_a_blocking_read(self, q: StreamQueue, rclient: redis.Redis) -> None:
        """read_new with BLOCK 5000 raises ConnectionError within a second of interrupt_read()."""
        q.ensure_group()
        outcome: dict[str, object] = {}
        done = threading.Event()

        def reader() -> None:
            try:
                outcome["value"] = q.read_new(1, 5000)
            except BaseException as exc:  # recorded for the assertion below
                outcome["exc"] = exc
            outcome["at"] = time.monotonic()
            done.set()

        thread = threading.Thread(target=reader, daemon=True)
        thread.start()

        def blocked() -> bool:
            return any(c.get("name") == READER_NAME and "b" in str(c.get("flags")) for c in rclient.client_list())

        wait_for(blocked, 5.0, "the reader blocked in XREADGROUP")
        interrupted_at = time.monotonic()
        q.interrupt_read()
        assert done.wait(3.0), "the blocking read was not cut"
        thread.join(1.0)
        assert isinstance(outcome.get("exc"), redis.exceptions.ConnectionError), outcome
        assert float(outcome["at"]) - interrupted_at < 1.0  # type: ignore[arg-type]

    def test_interrupt_without_a_read_is_harmless(self, q: StreamQueue) -> None:
        """interrupt_read with no read in progress does nothing; the queue keeps working."""
        q.ensure_group()
        q.interrupt_read()
        mid = q.enqueue(body(1))
        assert [e.message_id for e in q.read_new(1, 100)] == [mid]
