"""Lease-aware delivery on real Redis: the StreamQueue primitives, poison limit, ack retry, hand-back."""

from __future__ import annotations

import json
import time

import pytest
import redis

from plaita.store import scripts
from plaita.store.keyspace import DEFAULT
from plaita.store.leases import LeaseManager
from plaita.store.streams.queue import StreamQueue
from tests.support.lease_workers import (
    GROUP,
    QUEUE,
    FlakySettleRedis,
    Probe,
    enqueue,
    inproc_worker,
    pending_count,
    settings,
    wait_for,
    worker_client,
)

pytestmark = pytest.mark.redis


def make_queue(client: redis.Redis, consumer: str = "me") -> StreamQueue:
    q = StreamQueue(client, stream=QUEUE, group=GROUP, consumer=consumer, dlq_key=f"{QUEUE}:dlq", dlq_max_len=100)
    q.ensure_group()
    return q


def body(n: int, execution_id: str | None = None, **params: object) -> dict[str, object]:
    b: dict[str, object] = {"type": "start", "flow_id": "f", "params": {"n": n, **params}}
    if execution_id is not None:
        b["execution_id"] = execution_id
    return b


def pending_rows(client: redis.Redis) -> dict[str, tuple[str, int, int]]:
    """message id -> (consumer, idle ms, times delivered)."""
    rows = client.xpending_range(QUEUE, GROUP, "-", "+", 10_000)
    return {
        r["message_id"].decode(): (r["consumer"].decode(), int(r["time_since_delivered"]), int(r["times_delivered"]))
        for r in rows
    }


def consumers(client: redis.Redis) -> dict[str, dict[str, int]]:
    return {
        c["name"].decode(): {"pending": int(c["pending"]), "idle": int(c["idle"])}
        for c in client.xinfo_consumers(QUEUE, GROUP)
    }


def wait_idle(client: redis.Redis, ids: list[str], idle_ms: int) -> None:
    def idle_enough() -> bool:
        rows = pending_rows(client)
        return all(rows[i][1] > idle_ms for i in ids)

    wait_for(idle_enough, 5.0, f"entries idle > {idle_ms} ms")


class TestClaimUnleased:
    def test_skips_leased_entries_and_follows_its_cursor(self, bclient: redis.Redis) -> None:
        """50 idle pending entries, every 5th leased: claims of 10 per call walk forward and take the 40 unleased."""
        q = make_queue(bclient)
        ids = [enqueue(bclient, body(i, execution_id=f"exec-{i}" if i % 2 else None)) for i in range(50)]
        bclient.xreadgroup(GROUP, "dead", {QUEUE: ">"}, count=50)
        leased = set(ids[0::5])
        for i, mid in enumerate(ids):
            if mid in leased:
                eid = f"exec-{i}" if i % 2 else mid
                bclient.set(DEFAULT.lease_key(eid), "worker:dead@x:1", px=30_000)
        wait_idle(bclient, ids, 100)

        cursor, calls, claimed, skipped_total = "0-0", 0, [], 0
        previous_last = ""
        while True:
            cursor, entries, skipped = q.claim_unleased(cursor, 100, 10)
            calls += 1
            assert len(entries) <= 10
            got = [e.message_id for e in entries]
            # The cursor moves on: every call claims strictly later entries than the one before.
            assert all(id_key(m) > id_key(previous_last) for m in got if previous_last)
            if got:
                previous_last = got[-1]
            claimed += entries
            skipped_total += skipped
            if cursor == "0-0" or calls > 10:
                break
        claimed_ids = [e.message_id for e in claimed]
        assert calls == 5  # 4 full calls of 10, then the end of the pending list
        assert sorted(claimed_ids, key=id_key) == [m for m in ids if m not in leased]
        assert len(set(claimed_ids)) == 40
        assert skipped_total == 10
        assert all(e.delivery_count == 2 and e.fields is not None for e in claimed)
        rows = pending_rows(bclient)
        assert {mid for mid, row in rows.items() if row[0] == "me"} == set(claimed_ids)
        assert {mid for mid, row in rows.items() if row[0] == "dead"} == leased
        assert all(rows[m][2] == 1 for m in leased)  # leased entries were not touched

    def test_never_claims_an_entry_idle_less_than_the_threshold(self, bclient: redis.Redis) -> None:
        """An unleased entry read just now is left to its consumer."""
        q = make_queue(bclient)
        enqueue(bclient, body(1))
        bclient.xreadgroup(GROUP, "busy", {QUEUE: ">"}, count=1)
        cursor, entries, skipped = q.claim_unleased("0-0", 60_000, 10)
        assert (cursor, entries, skipped) == ("0-0", [], 0)
        assert [row[0] for row in pending_rows(bclient).values()] == ["busy"]


def id_key(mid: str) -> tuple[int, int]:
    """A stream id as a sortable (ms, seq) pair."""
    ms, _, seq = mid.partition("-")
    return int(ms), int(seq or 0)


class TestRenewPending:
    def test_never_pulls_back_an_entry_another_consumer_claimed(self, bclient: redis.Redis) -> None:
        """Renewal resets idle time of our own entries only, without bumping their delivery count."""
        q = make_queue(bclient)
        mine, taken = enqueue(bclient, body(1)), enqueue(bclient, body(2))
        bclient.xreadgroup(GROUP, "me", {QUEUE: ">"}, count=2)
        wait_idle(bclient, [mine, taken], 50)
        bclient.xclaim(QUEUE, GROUP, "successor", 0, [taken])
        wait_idle(bclient, [mine], 150)

        assert q.renew_pending([mine, taken]) == [mine]

        rows = pending_rows(bclient)
        assert rows[taken][0] == "successor" and rows[taken][2] == 2
        assert rows[mine][0] == "me" and rows[mine][2] == 1
        assert rows[mine][1] < 150  # idle time was reset

    def test_an_acked_entry_is_not_renewed(self, bclient: redis.Redis) -> None:
        """An entry acked meanwhile does not come back into the pending list."""
        q = make_queue(bclient)
        mid = enqueue(bclient, body(1))
        bclient.xreadgroup(GROUP, "me", {QUEUE: ">"}, count=1)
        q.ack(mid)
        assert q.renew_pending([mid]) == []
        assert pending_rows(bclient) == {}


class TestPruneConsumers:
    def test_removes_only_idle_consumers_with_nothing_pending_never_the_caller(self, bclient: redis.Redis) -> None:
        """Idle+empty goes; idle with pending, recently active and the caller itself stay."""
        q = make_queue(bclient, consumer="me")
        enqueue(bclient, body(1))
        bclient.xreadgroup(GROUP, "idle-with-pending", {QUEUE: ">"}, count=1)
        for name in ("idle-empty", "fresh-empty", "me"):
            bclient.xgroup_createconsumer(QUEUE, GROUP, name)
        wait_for(lambda: all(c["idle"] > 300 for c in consumers(bclient).values()), 5.0, "consumers idle > 300 ms")
        fresh = enqueue(bclient, body(2))
        bclient.xreadgroup(GROUP, "fresh-empty", {QUEUE: ">"}, count=1)  # active just now ...
        bclient.xack(QUEUE, GROUP, fresh)  # ... and nothing pending

        assert q.prune_consumers(300) == ["idle-empty"]
        assert set(consumers(bclient)) == {"idle-with-pending", "fresh-empty", "me"}
        assert pending_rows(bclient) and all(r[0] == "idle-with-pending" for r in pending_rows(bclient).values())


class TestSweepResidue:
    def test_deletes_only_acked_residue_in_bounded_batches(self, bclient: redis.Redis) -> None:
        """Residue goes, at most ``batch`` per call; pending entries and the unread backlog stay."""
        q = make_queue(bclient)
        ids = [enqueue(bclient, body(i)) for i in range(8)]
        bclient.xreadgroup(GROUP, "c", {QUEUE: ">"}, count=8)
        residue = ids[0:5] + ids[7:8]
        pending = ids[5:7]
        bclient.xack(QUEUE, GROUP, *residue)  # acked, never deleted
        backlog = [enqueue(bclient, body(100 + i)) for i in range(2)]

        swept = []
        for _ in range(10):
            n = q.sweep_residue(3)
            assert 0 <= n <= 3
            swept.append(n)
            if n == 0:
                break
        assert sum(swept) == len(residue)
        remaining = [m.decode() for m, _f in bclient.xrange(QUEUE)]
        assert remaining == pending + backlog
        assert set(pending_rows(bclient)) == set(pending)

    def test_never_deletes_a_pending_entry_behind_deleted_pending_ids(self, bclient: redis.Redis) -> None:
        """Pending ids whose entries were trimmed away must not hide a live pending entry from the sweep."""
        q = make_queue(bclient)
        ids = [enqueue(bclient, body(i)) for i in range(5)]
        bclient.xreadgroup(GROUP, "c", {QUEUE: ">"}, count=5)
        bclient.xack(QUEUE, GROUP, ids[0])  # residue
        bclient.xdel(QUEUE, *ids[1:4])  # deleted while pending (e.g. trimmed by a producer)

        assert q.sweep_residue(2) == 1
        assert [m.decode() for m, _f in bclient.xrange(QUEUE)] == [ids[4]]
        assert ids[4] in pending_rows(bclient)


class TestFencing:
    def test_acquire_refuses_a_live_holder_and_a_second_task_of_this_incarnation(self, bclient: redis.Redis) -> None:
        """Another consumer and this incarnation itself are refused; a restarted incarnation takes over."""
        first = LeaseManager(bclient, consumer="w1", ttl_s=10)
        lease = first.acquire("e1")
        assert not isinstance(lease, str) and lease.generation == 1
        assert LeaseManager(bclient, consumer="w2", ttl_s=10).acquire("e1") == lease.value
        assert first.acquire("e1") == lease.value  # same incarnation: no silent self-takeover
        restarted = LeaseManager(bclient, consumer="w1", ttl_s=10).acquire("e1")
        assert not isinstance(restarted, str) and restarted.generation == 2
        assert first.renew_many([lease]) == [False]
        assert first.release(lease) == 0
        assert bclient.get(DEFAULT.lease_key("e1")) == restarted.value.encode()


# -- worker-level ----------------------------------------------------------------------------


def dlq_envelopes(client: redis.Redis) -> list[dict[str, object]]:
    return [json.loads(f[b"payload"]) for _m, f in client.xrange(f"{QUEUE}:dlq")]


class TestPoison:
    def test_failing_task_is_dead_lettered_after_exactly_max_deliveries(
        self, redis_url: str, bclient: redis.Redis
    ) -> None:
        """A handler that always raises runs 3 times (delivery 1, 2, 3) and the 3rd failure dead-letters it."""
        probe = Probe()
        s = settings(redis_url, "poison", max_deliveries=3, claim_min_idle_ms=300, reclaim_interval_s=0.2)
        with inproc_worker(s, probe) as w:
            b = body(7, execution_id="poison-1", fail=True)
            mid = enqueue(bclient, b)
            wait_for(lambda: bclient.xlen(f"{QUEUE}:dlq") == 1, 15.0, "the task in the DLQ")
            wait_for(lambda: pending_count(bclient) == 0, 5.0, "nothing pending")
            counters = w.worker.counters
        runs = probe.snapshot()
        assert [r.delivery_count for r in runs] == [1, 2, 3]
        assert bclient.xlen(QUEUE) == 0
        (env,) = dlq_envelopes(bclient)
        assert env["reason"] == "processing_failed:RuntimeError:boom 7"
        assert env["source_stream"] == QUEUE
        assert env["source_id"] == mid
        assert env["delivery_count"] == 3
        assert env["payload"] == b
        assert isinstance(env["dead_lettered_at"], float) and abs(env["dead_lettered_at"] - time.time()) < 60
        assert counters.dead_lettered == 1 and counters.failed == 3 and counters.completed == 0
        assert bclient.get(DEFAULT.lease_key("poison-1")) is None  # released with each failure

    def test_claimed_entry_past_the_limit_is_dead_lettered_without_running(
        self, redis_url: str, bclient: redis.Redis
    ) -> None:
        """An entry already delivered 3 times to a crashed consumer goes to the DLQ as max_deliveries on claim."""
        make_queue(bclient, consumer="setup")
        b = body(9, execution_id="poison-2")
        mid = enqueue(bclient, b)
        bclient.xreadgroup(GROUP, "crashed", {QUEUE: ">"}, count=1)
        bclient.xclaim(QUEUE, GROUP, "crashed", 0, [mid])
        bclient.xclaim(QUEUE, GROUP, "crashed", 0, [mid])
        assert pending_rows(bclient)[mid][2] == 3
        probe = Probe()
        s = settings(redis_url, "survivor", max_deliveries=3, claim_min_idle_ms=100, reclaim_interval_s=0.2)
        with inproc_worker(s, probe):
            wait_for(lambda: bclient.xlen(f"{QUEUE}:dlq") == 1, 5.0, "the task in the DLQ")
            wait_for(lambda: pending_count(bclient) == 0, 5.0, "nothing pending")
        assert probe.snapshot() == []
        (env,) = dlq_envelopes(bclient)
        assert env["reason"] == "max_deliveries"
        assert env["delivery_count"] == 4
        assert env["source_id"] == mid and env["payload"] == b


class TestAckRetry:
    @pytest.mark.parametrize("failures", [1, 2])
    def test_failed_settle_is_retried_without_redelivery(
        self, redis_url: str, bclient: redis.Redis, failures: int
    ) -> None:
        """The settle transaction fails; the outcome is kept and acked after recovery, the handler ran once."""
        # Every script loaded first: a settle whose EVALSHA meets NOSCRIPT is re-sent once more
        # (a third XACK transaction), and whether the server had the script depended on timing.
        scripts.ensure_loaded(bclient, list(scripts.SCRIPTS.values()))
        s = settings(redis_url, "acker", claim_min_idle_ms=2000)
        client = worker_client(redis_url, s, FlakySettleRedis)
        assert isinstance(client, FlakySettleRedis)
        client.fail_acks = failures
        probe = Probe()
        with inproc_worker(s, probe, client=client) as w:
            mid = enqueue(bclient, body(1, execution_id="ack-1"))
            wait_for(lambda: bclient.xlen(QUEUE) == 0 and pending_count(bclient) == 0, 10.0, "the task acked")
            assert client.ack_attempts == failures + 1
            assert w.worker.counters.completed == 1
            assert w.worker.counters.reclaimed == 0
            # Nothing comes back: no second delivery within a further reclaim pass.
            assert bclient.get(DEFAULT.lease_key("ack-1")) is None
        assert [(r.message_id, r.delivery_count) for r in probe.snapshot()] == [(mid, 1)]


class TestHandBack:
    def test_unstarted_prefetched_tasks_are_handed_back_on_stop(self, redis_url: str, bclient: redis.Redis) -> None:
        """Stop with 5 prefetched tasks: they return as new, undelivered entries; the running one finishes."""
        probe = Probe()
        s = settings(redis_url, "holder", prefetch=5, concurrency=1, drain_timeout_s=5.0)
        with inproc_worker(s, probe) as w:
            ids = [enqueue(bclient, body(i, execution_id=f"hb-{i}", sleep_s=0.8 if i == 0 else 0)) for i in range(6)]
            probe.wait(lambda runs: len(runs) == 1, 5.0, "the first task running")
            # Accepted by the worker, not merely delivered: a read whose reply is still on its way
            # when the stop cuts it leaves entries pending for this consumer, unknown to it.
            wait_for(lambda: w.worker.counters.read == 6, 5.0, "all 6 accepted by the worker")
            assert pending_count(bclient) == 6
            w.stop()
            assert w.worker.counters.handed_back == 5
            assert w.worker.counters.completed == 1
        (first,) = probe.snapshot()
        assert first.message_id == ids[0] and not first.cancelled and first.ended_at_s is not None
        assert pending_count(bclient) == 0
        back = bclient.xrange(QUEUE)
        assert len(back) == 5
        new_ids = [m.decode() for m, _f in back]
        assert not set(new_ids) & set(ids)
        assert [json.loads(f[b"payload"])["execution_id"] for _m, f in back] == [f"hb-{i}" for i in range(1, 6)]
        last_delivered = next(g for g in bclient.xinfo_groups(QUEUE) if g["name"] == GROUP.encode())[
            "last-delivered-id"
        ]
        assert all(id_key(m) > id_key(last_delivered.decode()) for m in new_ids)  # never delivered

        probe2 = Probe()
        with inproc_worker(settings(redis_url, "taker"), probe2):
            probe2.wait(lambda runs: len(runs) == 5 and all(r.ended_at_s for r in runs), 5.0, "5 tasks on the taker")
            wait_for(lambda: bclient.xlen(QUEUE) == 0 and pending_count(bclient) == 0, 5.0, "all acked")
        assert sorted(r.message_id for r in probe2.snapshot()) == sorted(new_ids)
        assert all(r.delivery_count == 1 for r in probe2.snapshot())

    def test_task_running_at_the_drain_deadline_is_handed_back(self, redis_url: str, bclient: redis.Redis) -> None:
        """A task outliving the drain is cancelled, not acked, and runs elsewhere as delivery 1 with a new lease."""
        probe = Probe()
        s = settings(redis_url, "slow", drain_timeout_s=0.5, lease_ttl_s=10.0)
        with inproc_worker(s, probe) as w:
            mid = enqueue(bclient, body(1, execution_id="drain-1", first_sleep_s=20))
            probe.wait(lambda runs: len(runs) == 1, 5.0, "the task running")
            wait_for(lambda: bclient.exists(DEFAULT.lease_key("drain-1")) == 1, 5.0, "its lease")
            took_s = w.stop()
            assert took_s < 3.0
            assert w.worker.counters.handed_back == 1
            assert w.worker.counters.completed == 0
        probe.wait(lambda runs: runs[0].ended_at_s is not None, 5.0, "the old handler to return")
        (old,) = probe.snapshot()
        assert old.cancelled
        assert bclient.get(DEFAULT.lease_key("drain-1")) is None  # released in the hand-back transaction
        assert pending_count(bclient) == 0
        (entry,) = bclient.xrange(QUEUE)
        assert entry[0].decode() != mid

        probe2 = Probe(sleeps=False)
        with inproc_worker(settings(redis_url, "next"), probe2):
            probe2.wait(lambda runs: len(runs) == 1 and runs[0].ended_at_s is not None, 5.0, "the task elsewhere")
            wait_for(lambda: bclient.xlen(QUEUE) == 0 and pending_count(bclient) == 0, 5.0, "acked")
        (again,) = probe2.snapshot()
        assert again.delivery_count == 1 and again.fencing_token == old.fencing_token + 1
        assert not again.cancelled
