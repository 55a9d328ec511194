"""Lease format v2 on real Redis, and a queue shared by v1 and v2 workers.

v2 takes the generation from the partition's counter (``plaita:executions:lease-generation``)
instead of a fence key per execution, so an acquire creates one key, not two, and a released lease
leaves nothing behind. These tests pin that the generations stay unique and rising, that they never
go back when a fleet switches formats in either direction, and that a fenced write of a holder the
other format superseded is refused (docs/reliability.md, "Lease format")."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from plaita.config import ConfigError, Settings
from plaita.store.keyspace import DEFAULT, Keyspace
from plaita.store.leases import Lease, LeaseManager, fenced_set
from tests.support.lease_workers import (
    QUEUE,
    Probe,
    counter,
    enqueue,
    inproc_worker,
    pending_count,
    settings,
    wait_for,
    worker_proc,
)

pytestmark = pytest.mark.redis

STATE = "plaita:test:state"
COUNTER = DEFAULT.generation_key(0)


def v2(client: redis.Redis, consumer: str, ttl_s: float = 10.0, keyspace: Keyspace = DEFAULT) -> LeaseManager:
    return LeaseManager(client, consumer=consumer, ttl_s=ttl_s, lease_format="v2", keyspace=keyspace)


def v1(client: redis.Redis, consumer: str, ttl_s: float = 10.0) -> LeaseManager:
    return LeaseManager(client, consumer=consumer, ttl_s=ttl_s)


def held(got: Lease | str) -> Lease:
    assert not isinstance(got, str), f"refused: {got}"
    return got


def acquired_after_expiry(manager: LeaseManager, execution_id: str) -> Lease:
    """Poll until ``manager`` gets the lease (an earlier short one expiring); the lease."""
    got: list[Lease] = []

    def takes() -> bool:
        lease = manager.acquire(execution_id)
        if not isinstance(lease, str):
            got.append(lease)
        return bool(got)

    wait_for(takes, 30.0, f"the lease of {execution_id} expiring")
    return got[0]


class TestOneKey:
    def test_acquire_creates_the_lease_key_alone_and_release_leaves_nothing(self, bclient: redis.Redis) -> None:
        leases = v2(bclient, "w1")
        a, b, c = (held(x) for x in leases.acquire_many(["e1", "e2", "e3"]))
        assert [a.generation, b.generation, c.generation] == [1, 2, 3]
        assert bclient.get(COUNTER) == b"3" and bclient.ttl(COUNTER) == -1
        assert bclient.get(DEFAULT.lease_key("e1")) == f"{leases.holder}:1".encode() == a.value.encode()
        assert 9_000 < bclient.pttl(DEFAULT.lease_key("e1")) <= 10_000
        assert bclient.exists(*(DEFAULT.fence_key(e) for e in ("e1", "e2", "e3"))) == 0
        assert v2(bclient, "w2").acquire("e1") == a.value  # held: refused
        assert fenced_set(bclient, "e1", 1, f"{STATE}:e1", "mine")
        assert all(leases.release(x) for x in (a, b, c))
        assert bclient.keys("plaita:execution:*") == []  # no key per execution is left
        again = held(v2(bclient, "w2").acquire("e1"))
        assert again.generation == 4 and bclient.get(COUNTER) == b"4"
        assert not fenced_set(bclient, "e1", 1, f"{STATE}:e1", "stale")
        assert fenced_set(bclient, "e1", 4, f"{STATE}:e1", "fresh")

    def test_an_expired_lease_is_taken_and_its_holder_fenced_out(self, bclient: redis.Redis) -> None:
        old = v2(bclient, "w1", ttl_s=0.3)
        first = held(old.acquire("e1"))
        successor = acquired_after_expiry(v2(bclient, "w2"), "e1")
        assert successor.generation == 2
        assert old.renew_many([first]) == [False]
        assert not fenced_set(bclient, "e1", 1, f"{STATE}:e1", "stale")
        assert not old.release(first) and not old.release_orphan("e1")
        assert fenced_set(bclient, "e1", 2, f"{STATE}:e1", "fresh")

    def test_a_restarted_incarnation_takes_its_lease_over_at_once(self, bclient: redis.Redis) -> None:
        before = v2(bclient, "w1", ttl_s=60)
        lease = held(before.acquire("e1"))
        assert before.acquire("e1") == lease.value and before.ours("e1", lease.value) == lease
        after = held(v2(bclient, "w1", ttl_s=60).acquire("e1"))
        assert after.generation == 2 and not fenced_set(bclient, "e1", 1, f"{STATE}:e1", "stale")
        assert v2(bclient, "w2").acquire("e1") == after.value

    def test_a_bad_counter_refuses_v2_acquires_only(self, bclient: redis.Redis) -> None:
        """A counter of another type or no integer: v2 cannot know the last generation and
        refuses; v1 goes on from the fence keys, as every earlier version did."""
        bclient.hset(COUNTER, "a", "b")
        assert v2(bclient, "w1").acquire("e1") == f"!wrongtype generation counter {COUNTER}=hash"
        bclient.delete(COUNTER)
        bclient.set(COUNTER, "soon")
        assert v2(bclient, "w1").acquire("e1") == f"!generation counter {COUNTER} is not an integer"
        assert held(v1(bclient, "w1").acquire("e1")).generation == 1
        assert bclient.get(COUNTER) == b"soon" and bclient.exists(DEFAULT.lease_key("e2")) == 0

    def test_a_takeover_stays_above_the_lease_it_takes_even_without_its_fence(self, bclient: redis.Redis) -> None:
        """A v1 lease at generation 5 whose fence key was replaced by a hash: v2 reads that fence as
        absent and the counter is empty, so only the lease value shows the last generation."""
        before = v1(bclient, "w1", ttl_s=60)
        for _ in range(5):
            last = held(before.acquire("e1"))
            before.release(last)
        last = held(before.acquire("e1"))
        assert last.generation == 6
        bclient.delete(DEFAULT.fence_key("e1"))
        bclient.hset(DEFAULT.fence_key("e1"), "a", "b")
        after = held(v2(bclient, "w1", ttl_s=60).acquire("e1"))
        assert after.generation == 7 and bclient.get(COUNTER) == b"7"
        assert not fenced_set(bclient, "e1", 6, f"{STATE}:e1", "stale")

    def test_a_reply_read_later_and_tenants_keys_use_the_same_counter(self, bclient: redis.Redis) -> None:
        leases = v2(bclient, "w1")
        pending = leases.send_acquire_many(["a", "b"], [None, DEFAULT.for_tenant("t1")])
        a, b = (held(x) for x in pending.result())
        assert (a.generation, b.generation) == (1, 2) and bclient.get(COUNTER) == b"2"
        assert b.key == DEFAULT.for_tenant("t1").lease_key("b") and bclient.exists(b.key) == 1
        assert held(leases.acquire_many(["c"], [DEFAULT.for_tenant("t2")])[0]).generation == 3

    def test_each_partition_has_its_counter_in_its_slot(self, bclient: redis.Redis) -> None:
        ks = Keyspace("plaita:test:parts", 3, tagged=True)
        ids = [f"p-{i}" for i in range(30)]
        leases = [held(x) for x in v2(bclient, "w1", keyspace=ks).acquire_many(ids)]
        for p in range(3):
            gens = sorted(x.generation for x, e in zip(leases, ids, strict=True) if ks.partition_of(e) == p)
            assert gens == list(range(1, len(gens) + 1))
            assert bclient.get(ks.generation_key(p)) == str(len(gens)).encode()
            assert ks.tags[p] in ks.generation_key(p)


class TestBothFormats:
    """The dual read: whichever format a lease was written in, the other honours it."""

    def test_generations_never_go_back_across_switches(self, bclient: redis.Redis) -> None:
        """v1 x3, v2, v1, v2: 1..6, each releasing; every older generation is fenced out."""
        managers = [v1(bclient, "a"), v1(bclient, "a"), v1(bclient, "a"), v2(bclient, "b"), v1(bclient, "a")]
        managers.append(v2(bclient, "b"))
        gens = []
        for manager in managers:
            lease = held(manager.acquire("e1"))
            gens.append(lease.generation)
            assert fenced_set(bclient, "e1", lease.generation, f"{STATE}:e1", str(lease.generation))
            assert all(not fenced_set(bclient, "e1", g, f"{STATE}:e1", "stale") for g in gens[:-1])
            assert manager.release(lease)
        assert gens == [1, 2, 3, 4, 5, 6]
        assert bclient.get(f"{STATE}:e1") == b"6"

    @pytest.mark.parametrize(("first", "second"), [("v1", "v2"), ("v2", "v1")])
    def test_a_live_lease_of_either_format_blocks_the_other(
        self, bclient: redis.Redis, first: str, second: str
    ) -> None:
        holder = LeaseManager(bclient, consumer="a", ttl_s=30, lease_format=first)
        lease = held(holder.acquire("e1"))
        other = LeaseManager(bclient, consumer="b", ttl_s=30, lease_format=second)
        assert other.acquire("e1") == lease.value
        assert other.release_orphan("e1") is False and holder.renew_many([lease]) == [True]
        assert fenced_set(bclient, "e1", 1, f"{STATE}:e1", "mine")

    @pytest.mark.parametrize(("loser", "winner"), [("v1", "v2"), ("v2", "v1")])
    def test_the_holder_the_other_format_superseded_is_fenced_out(
        self, bclient: redis.Redis, loser: str, winner: str
    ) -> None:
        """A holder paused past its TTL: the other format's successor gets a newer generation, the
        loser's writes, renewals and releases are refused, the winner's go through."""
        old = LeaseManager(bclient, consumer="a", ttl_s=0.3, lease_format=loser)
        first = held(old.acquire("e1"))
        new = acquired_after_expiry(LeaseManager(bclient, consumer="b", ttl_s=30, lease_format=winner), "e1")
        assert new.generation == first.generation + 1
        assert not fenced_set(bclient, "e1", first.generation, f"{STATE}:e1", "stale")
        assert old.renew_many([first]) == [False]
        assert not old.release(first) and not old.release_orphan("e1")
        assert fenced_set(bclient, "e1", new.generation, f"{STATE}:e1", "fresh")
        assert bclient.get(f"{STATE}:e1") == b"fresh"


def test_the_flag_is_checked() -> None:
    assert Settings(lease_format="v2").lease_format == "v2"
    with pytest.raises(ConfigError, match="--lease-format must be one of v1, v2"):
        Settings(lease_format="v3")


class TestMixedFleet:
    def test_v1_and_v2_workers_on_one_queue_never_run_an_execution_twice_at_once(
        self, redis_url: str, bclient: redis.Redis
    ) -> None:
        """Two workers, one per format, drain 4 tasks each of 5 executions: every task runs once,
        no two runs of an execution overlap, and each execution's generations rise run by run."""
        probe = Probe()
        base = {"concurrency": 2, "claim_min_idle_ms": 2000, "lease_ttl_s": 10.0}
        s1 = settings(redis_url, "mix-v1", lease_format="v1", **base)
        s2 = settings(redis_url, "mix-v2", lease_format="v2", **base)
        with inproc_worker(s1, probe) as a, inproc_worker(s2, probe) as b:
            ids = [f"mix-{i}" for i in range(5)]
            for n in range(4):
                for eid in ids:
                    enqueue(
                        bclient,
                        {"type": "start", "flow_id": "f", "execution_id": eid, "params": {"sleep_s": 0.05, "n": n}},
                    )
            probe.wait(lambda runs: len(runs) == 20 and all(r.ended_at_s for r in runs), 60.0, "20 runs")
            wait_for(lambda: bclient.xlen(QUEUE) == 0 and pending_count(bclient) == 0, 15.0, "all acked")
            assert a.worker.counters.completed > 0 and b.worker.counters.completed > 0
            assert a.worker.counters.leases_lost == b.worker.counters.leases_lost == 0
        runs = probe.snapshot()
        assert len({r.message_id for r in runs}) == 20
        for eid in ids:
            mine = sorted((r for r in runs if r.execution_id == eid), key=lambda r: r.started_at_s)
            assert len(mine) == 4
            for before, after in zip(mine, mine[1:], strict=False):
                assert before.ended_at_s is not None and after.started_at_s >= before.ended_at_s
                assert after.fencing_token > before.fencing_token

    def test_a_v1_worker_takes_over_a_killed_v2_workers_execution(
        self, redis_url: str, bclient: redis.Redis, tmp_path: Path
    ) -> None:
        """kill -9 of a v2 worker mid-task: the v1 worker reclaims the entry once the lease expired,
        and runs it under a generation above the v2 one (the fence goes on from the counter)."""
        args = ("--claim-min-idle-ms", "500", "--lease-ttl-seconds", "2", "--reclaim-interval-s", "0.5")
        with worker_proc(redis_url, tmp_path, "kill-v2", *args, "--lease-format", "v2") as a:
            a.wait_reading()
            enqueue(
                bclient, {"type": "start", "flow_id": "f", "execution_id": "kill-1", "params": {"first_sleep_s": 60}}
            )
            wait_for(lambda: counter(bclient, "executions", "kill-1") == 1, 30.0, "A running the task")
            assert bclient.get(DEFAULT.lease_key("kill-1")).startswith(b"worker:kill-v2@")
            assert bclient.get(COUNTER) == b"1" and bclient.exists(DEFAULT.fence_key("kill-1")) == 0
            with worker_proc(redis_url, tmp_path, "kill-v1", *args, "--lease-format", "v1") as b:
                b.wait_reading()
                a.kill9()
                wait_for(lambda: counter(bclient, "completed", "kill-1") == 1, 30.0, "B completing the task")
                wait_for(lambda: pending_count(bclient) == 0 and bclient.xlen(QUEUE) == 0, 10.0, "acked")
                assert b.terminate() == 0
        assert counter(bclient, "executions", "kill-1") == 2
        assert b.counters()["reclaimed"] == 1
        assert bclient.get(DEFAULT.fence_key("kill-1")) == b"2"  # v1 went on from the v2 generation
