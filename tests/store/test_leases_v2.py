"""The one-key lease format (v2) on real Redis, and a queue shared by v1 and v2 workers.

v2 keeps the generation in the lease key itself (``v2|gen|expiry ms|holder``, kept 7 days past
the lease), so a lease expires by its value, not by its key: these tests pin that expiry, release
and takeover free it, that generations never go back across formats in either direction, and
that a fenced write of a holder the other format superseded is refused (docs/reliability.md,
"Lease format")."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from plaita.config import ConfigError, Settings
from plaita.store.keyspace import DEFAULT
from plaita.store.leases import FENCE_TTL_S, Lease, LeaseManager, fenced_set, lease_live
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


def v2(client: redis.Redis, consumer: str, ttl_s: float = 10.0) -> LeaseManager:
    return LeaseManager(client, consumer=consumer, ttl_s=ttl_s, lease_format="v2")


def v1(client: redis.Redis, consumer: str, ttl_s: float = 10.0) -> LeaseManager:
    return LeaseManager(client, consumer=consumer, ttl_s=ttl_s)


def held(got: Lease | str) -> Lease:
    assert not isinstance(got, str), f"refused: {got}"
    return got


def server_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


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
    def test_acquire_writes_one_key_holding_the_generation_and_release_keeps_it(self, bclient: redis.Redis) -> None:
        leases = v2(bclient, "w1")
        lease = held(leases.acquire("e1"))
        assert lease == Lease("e1", DEFAULT.lease_key("e1"), f"{leases.holder}:1", 1)
        gen, expiry_ms, holder = bclient.get(DEFAULT.lease_key("e1")).decode().split("|")[1:]
        assert (gen, holder) == ("1", leases.holder)
        assert 9_000 < int(expiry_ms) - server_ms(bclient) <= 10_000
        assert (FENCE_TTL_S - 60) * 1000 < bclient.pttl(DEFAULT.lease_key("e1")) <= FENCE_TTL_S * 1000 + 10_000
        assert bclient.exists(DEFAULT.fence_key("e1")) == 0  # the one key is the whole lease
        assert v2(bclient, "w2").acquire("e1") == lease.value  # held: refused, named like a v1 lease
        assert leases.release(lease) and not leases.release(lease)
        assert bclient.get(DEFAULT.lease_key("e1")) == b"v2|1|0|"  # free, its generation kept
        assert not lease_live(bclient.get(DEFAULT.lease_key("e1")), server_ms(bclient))
        assert not fenced_set(bclient, "e1", 1, f"{STATE}:e1", "after release")
        assert held(v2(bclient, "w2").acquire("e1")).generation == 2

    def test_an_expired_lease_is_taken_and_its_holder_fenced_out(self, bclient: redis.Redis) -> None:
        """Expiry by value: the key stays, the old holder's renew, writes and release all fail."""
        old = v2(bclient, "w1", ttl_s=0.3)
        first = held(old.acquire("e1"))
        assert fenced_set(bclient, "e1", 1, f"{STATE}:e1", "first")
        successor = acquired_after_expiry(v2(bclient, "w2"), "e1")
        assert successor.generation == 2
        assert old.renew_many([first]) == [False]
        assert not fenced_set(bclient, "e1", 1, f"{STATE}:e1", "stale")
        assert not old.release(first) and not old.release_orphan("e1")
        assert fenced_set(bclient, "e1", 2, f"{STATE}:e1", "fresh")
        assert bclient.get(f"{STATE}:e1") == b"fresh"

    def test_renew_moves_the_expiry_and_keeps_the_key_past_the_lease(self, bclient: redis.Redis) -> None:
        leases = v2(bclient, "w1", ttl_s=0.5)
        lease = held(leases.acquire("e1"))
        bclient.pexpire(DEFAULT.lease_key("e1"), 60_000)  # shows that renew puts the key's PX back
        for _ in range(3):
            assert leases.renew_many([lease]) == [True]
        expiry_ms = int(bclient.get(DEFAULT.lease_key("e1")).decode().split("|")[2])
        assert 0 < expiry_ms - server_ms(bclient) <= 500
        assert bclient.pttl(DEFAULT.lease_key("e1")) > (FENCE_TTL_S - 60) * 1000

    def test_a_restarted_incarnation_takes_its_lease_over_at_once(self, bclient: redis.Redis) -> None:
        before = v2(bclient, "w1", ttl_s=60)
        lease = held(before.acquire("e1"))
        assert before.acquire("e1") == lease.value and before.ours("e1", lease.value) == lease
        after = held(v2(bclient, "w1", ttl_s=60).acquire("e1"))
        assert after.generation == 2 and not fenced_set(bclient, "e1", 1, f"{STATE}:e1", "stale")
        assert v2(bclient, "w2").acquire("e1") == after.value

    def test_keys_of_other_types_are_refused_and_left_alone(self, bclient: redis.Redis) -> None:
        bclient.hset(DEFAULT.lease_key("hash-lease"), "a", "b")
        got = v2(bclient, "w1").acquire_many(["hash-lease", "good"])
        assert got[0] == "!wrongtype lease=hash fence=none" and held(got[1]).generation == 1
        assert bclient.type(DEFAULT.lease_key("hash-lease")) == b"hash"


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
        """kill -9 of a v2 worker mid-task: the v1 worker reclaims the entry once the lease's expiry
        (in its value; the key stays) has passed, and runs it under the next generation."""
        args = ("--claim-min-idle-ms", "500", "--lease-ttl-seconds", "2", "--reclaim-interval-s", "0.5")
        with worker_proc(redis_url, tmp_path, "kill-v2", *args, "--lease-format", "v2") as a:
            a.wait_reading()
            enqueue(
                bclient, {"type": "start", "flow_id": "f", "execution_id": "kill-1", "params": {"first_sleep_s": 60}}
            )
            wait_for(lambda: counter(bclient, "executions", "kill-1") == 1, 30.0, "A running the task")
            assert bclient.get(DEFAULT.lease_key("kill-1")).startswith(b"v2|1|")
            with worker_proc(redis_url, tmp_path, "kill-v1", *args, "--lease-format", "v1") as b:
                b.wait_reading()
                a.kill9()
                wait_for(lambda: counter(bclient, "completed", "kill-1") == 1, 30.0, "B completing the task")
                wait_for(lambda: pending_count(bclient) == 0 and bclient.xlen(QUEUE) == 0, 10.0, "acked")
                assert b.terminate() == 0
        assert counter(bclient, "executions", "kill-1") == 2
        assert b.counters()["reclaimed"] == 1
        assert bclient.get(DEFAULT.fence_key("kill-1")) == b"2"  # v1 went on from the v2 generation
