"""Execution leases on real Redis: exclusivity, crash recovery, no restart storm, freezes and fencing."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from plaita.store.keyspace import DEFAULT
from plaita.store.leases import FENCE_TTL_S, Lease, LeaseManager, fenced_set
from plaita.tasks import Task
from tests.support.lease_workers import (
    QUEUE,
    Probe,
    Run,
    counter,
    enqueue,
    inproc_worker,
    pending_count,
    settings,
    wait_for,
    worker_proc,
)
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.redis

#: Fast timing for subprocess workers: reclaim every 0.5 s, BLOCK 200 ms.
FAST = ("--reclaim-interval-s", "0.5", "--read-block-ms", "200")


def task_body(execution_id: str, **params: object) -> dict[str, object]:
    return {"type": "start", "flow_id": "f", "execution_id": execution_id, "params": dict(params)}


def all_equal(client: redis.Redis, kind: str, ids: list[str], value: int) -> Callable[[], bool]:
    return lambda: all(counter(client, kind, e) == value for e in ids)


def deliveries(client: redis.Redis, execution_id: str) -> list[int]:
    return [int(x) for x in client.lrange(f"plaita:test:deliveries:{execution_id}", 0, -1)]


class TestExclusivity:
    def test_two_workers_run_each_long_task_exactly_once(
        self, redis_url: str, bclient: redis.Redis, tmp_path: Path
    ) -> None:
        """Tasks 3x longer than the claim idle threshold are never claimed from the worker running them."""
        args = ("--concurrency", "2", "--claim-min-idle-ms", "500", "--lease-ttl-seconds", "3", *FAST)
        handler = "tests.support.handlers:count_in_redis"
        with (
            worker_proc(redis_url, tmp_path, "ex-a", *args, handler=handler) as a,
            worker_proc(redis_url, tmp_path, "ex-b", *args, handler=handler) as b,
        ):
            a.wait_reading()
            b.wait_reading()
            ids = [f"ex-{i}" for i in range(6)]
            for eid in ids:
                enqueue(bclient, task_body(eid, sleep_s=1.5))
            wait_for(all_equal(bclient, "completed", ids, 1), 20.0, "6 tasks completed")
            wait_for(lambda: bclient.xlen(QUEUE) == 0 and pending_count(bclient) == 0, 5.0, "all acked")
            assert a.terminate() == 0 and b.terminate() == 0
        assert [counter(bclient, "executions", e) for e in ids] == [1] * 6
        ca, cb = a.counters(), b.counters()
        assert ca["completed"] + cb["completed"] == 6
        assert ca["completed"] > 0 and cb["completed"] > 0  # both really competed for the tasks
        assert ca["reclaimed"] == cb["reclaimed"] == 0
        assert ca["leases_lost"] == cb["leases_lost"] == 0

    def test_second_task_of_a_running_execution_waits_for_the_lease(self, redis_url: str, bclient: redis.Redis) -> None:
        """On one worker, a task of an execution already running is skipped, then runs after it, never beside it."""
        probe = Probe()
        s = settings(redis_url, "same", concurrency=2, claim_min_idle_ms=300, reclaim_interval_s=0.2)
        with inproc_worker(s, probe) as w:
            enqueue(bclient, task_body("same-1", sleep_s=1.0))
            probe.wait(lambda runs: len(runs) == 1, 5.0, "the first task running")
            second = enqueue(bclient, task_body("same-1"))
            wait_for(lambda: w.worker.counters.lease_conflicts >= 1, 5.0, "the second task skipped")
            probe.wait(lambda runs: len(runs) == 2 and all(r.ended_at_s for r in runs), 10.0, "both tasks run")
            wait_for(lambda: bclient.xlen(QUEUE) == 0 and pending_count(bclient) == 0, 5.0, "both acked")
            assert w.worker.counters.leases_lost == 0
        first, then = probe.snapshot()
        assert not first.cancelled
        assert first.ended_at_s is not None and then.started_at_s >= first.ended_at_s
        assert then.message_id == second and then.fencing_token == first.fencing_token + 1


class TestCrashRecovery:
    def test_other_worker_finishes_a_killed_workers_task_after_the_lease_expires(
        self, redis_url: str, bclient: redis.Redis, tmp_path: Path, record_property: Callable[[str, object], None]
    ) -> None:
        """kill -9 mid-task: another worker completes it within ttl + reclaim interval + 2 s, run at most twice."""
        ttl_s, reclaim_s = 2.0, 0.5
        args = ("--claim-min-idle-ms", "500", "--lease-ttl-seconds", str(ttl_s), *FAST)
        with worker_proc(redis_url, tmp_path, "crash-a", *args) as a:
            a.wait_reading()
            enqueue(bclient, task_body("crash-1", first_sleep_s=30))
            wait_for(lambda: bclient.exists(DEFAULT.lease_key("crash-1")) == 1, 10.0, "A holding the lease")
            with worker_proc(redis_url, tmp_path, "crash-b", *args) as b:
                b.wait_reading()
                killed_at = a.kill9()
                wait_for(lambda: counter(bclient, "completed", "crash-1") == 1, 15.0, "B completing the task")
                recovery_s = time.monotonic() - killed_at
                record_property("crash_recovery_s", round(recovery_s, 3))
                wait_for(lambda: pending_count(bclient) == 0 and bclient.xlen(QUEUE) == 0, 5.0, "acked")
                assert b.terminate() == 0
        assert recovery_s <= ttl_s + reclaim_s + 2.0, f"recovery took {recovery_s:.2f} s"
        assert counter(bclient, "executions", "crash-1") == 2
        # A killed worker's task is a crash suspect: its redelivery is not charged (issue 30).
        assert deliveries(bclient, "crash-1") == [1, 1]
        assert b.counters()["reclaimed"] == 1
        assert int(bclient.get(DEFAULT.fence_key("crash-1")) or 0) == 2


class TestNoRestartStorm:
    def test_live_tasks_are_never_claimed_and_a_restart_takes_its_own_back(
        self, redis_url: str, bclient: redis.Redis, tmp_path: Path, record_property: Callable[[str, object], None]
    ) -> None:
        """B never claims A's running tasks; A restarted under the same name resumes them at once, B still none."""
        ttl_s = 20.0  # wide enough that a restart "at once" and lease expiry stay apart on a loaded machine
        args = ("--concurrency", "3", "--claim-min-idle-ms", "500", "--lease-ttl-seconds", str(ttl_s), *FAST)
        ids = [f"storm-{i}" for i in range(3)]
        with worker_proc(redis_url, tmp_path, "storm-a", *args) as a:
            a.wait_reading()
            for eid in ids:  # the first run outlives B's start and 3 passes under any load; A is killed in it
                enqueue(bclient, task_body(eid, first_sleep_s=60))
            wait_for(all_equal(bclient, "executions", ids, 1), 10.0, "A running all 3")
            with worker_proc(redis_url, tmp_path, "storm-b", *args, log_level="DEBUG") as b:
                b.wait_reading()
                passes_before = b.stderr().count("-> RECLAIMING")
                wait_for(lambda: b.stderr().count("-> RECLAIMING") >= passes_before + 3, 10.0, "3 reclaim passes by B")
                assert b.counters().get("reclaimed", 0) == 0
                assert [counter(bclient, "executions", e) for e in ids] == [1, 1, 1]
                old_leases = [bclient.get(DEFAULT.lease_key(e)) for e in ids]
                assert all(v is not None and v.startswith(b"worker:storm-a@") for v in old_leases)

                killed_at = a.kill9()
                # B looks at the abandoned entries (idle > 500 ms) and leaves them: their lease is live.
                wait_for(lambda: "reclaim skipped 3 idle entries" in b.stderr(), 15.0, "B skipping the leased entries")
                with worker_proc(redis_url, tmp_path, "storm-a", *args, tag="storm-a2") as a2:
                    wait_for(all_equal(bclient, "executions", ids, 2), 15.0, "A' resuming its own tasks")
                    resumed_s = time.monotonic() - a2.started_at_s
                    since_kill_s = time.monotonic() - killed_at
                    record_property("restart_resume_s", round(resumed_s, 3))
                    record_property("restart_resume_since_kill_s", round(since_kill_s, 3))
                    wait_for(all_equal(bclient, "completed", ids, 1), 10.0, "all completed")
                    wait_for(lambda: pending_count(bclient) == 0 and bclient.xlen(QUEUE) == 0, 5.0, "all acked")
                    assert a2.terminate() == 0
                assert b.terminate() == 0
        assert since_kill_s < ttl_s / 2, f"A' resumed {since_kill_s:.2f} s after the kill: that is lease expiry"
        assert resumed_s < ttl_s / 2, f"A' took {resumed_s:.2f} s from its start to resume its own tasks"
        assert "resuming 3 of this consumer's own pending tasks" in a2.stderr()
        _assert_only_the_owner_ran_them(bclient, ids, owner=a2, other=b)


def _assert_only_the_owner_ran_them(bclient: redis.Redis, ids: list[str], *, owner: Any, other: Any) -> None:
    """Each task ran twice (A, then A'), both by its owner: the other worker reclaimed and ran none.
    A' re-ran them as crash suspects, so the re-run is not charged a delivery (issue 30)."""
    assert all(deliveries(bclient, e) == [1, 1] for e in ids)
    assert other.counters()["reclaimed"] == 0 and other.counters()["completed"] == 0
    assert "reclaimed task" not in other.stderr()
    assert owner.counters()["reclaimed"] == 0 and owner.counters()["completed"] == 3
    assert all(int(bclient.get(DEFAULT.fence_key(e)) or 0) == 2 for e in ids)


@pytest.mark.chaos
class TestRedisFreeze:
    def test_freeze_shorter_than_the_ttl_keeps_the_lease(self, private_redis: RedisServer) -> None:
        """SIGSTOP 1.5 s with ttl 4 s during a task: same lease and generation after, completed once, acked."""
        client = private_redis.client()
        probe = Probe()
        s = settings(private_redis.url, "freeze-short", lease_ttl_s=4.0, claim_min_idle_ms=1000)
        with inproc_worker(s, probe) as w:
            enqueue(client, task_body("fz-1", sleep_s=3.5))
            probe.wait(lambda runs: len(runs) == 1, 5.0, "the task running")
            wait_for(lambda: client.exists(DEFAULT.lease_key("fz-1")) == 1, 5.0, "its lease")
            before = client.get(DEFAULT.lease_key("fz-1"))
            private_redis.freeze()
            try:
                time.sleep(1.5)  # the fault itself: Redis answers nothing for 1.5 s
            finally:
                private_redis.thaw()
            assert probe.snapshot()[0].ended_at_s is None  # still running after the freeze
            assert client.get(DEFAULT.lease_key("fz-1")) == before
            probe.wait(lambda runs: runs[0].ended_at_s is not None, 5.0, "the task finishing")
            wait_for(lambda: client.xlen(QUEUE) == 0 and pending_count(client) == 0, 5.0, "acked")
            assert w.worker.counters.leases_lost == 0 and w.worker.counters.completed == 1
        (run,) = probe.snapshot()
        assert not run.cancelled and run.fencing_token == 1
        assert int(client.get(DEFAULT.fence_key("fz-1")) or 0) == 1  # never re-acquired
        assert client.get(DEFAULT.lease_key("fz-1")) is None  # released with the ack
        client.close()

    def test_freeze_longer_than_the_ttl_cancels_and_fences_the_old_holder(self, private_redis: RedisServer) -> None:
        """SIGSTOP 4 s with ttl 2 s: the handler is cancelled, its old-generation write refused, nothing acked."""
        client = private_redis.client()
        successor_ready = threading.Event()
        state_key = "plaita:test:state:fz-2"

        def write_after_cancel(task: Task, run: Run) -> None:
            assert successor_ready.wait(15.0)
            run.extra["fenced_write"] = fenced_set(client, task.execution_id, task.fencing_token, state_key, "stale")

        probe = Probe(hook=write_after_cancel)
        s = settings(private_redis.url, "freeze-long", lease_ttl_s=2.0, claim_min_idle_ms=8000)
        with inproc_worker(s, probe) as w:
            mid = enqueue(client, task_body("fz-2", sleep_s=30))
            probe.wait(lambda runs: len(runs) == 1, 5.0, "the task running")
            wait_for(lambda: client.exists(DEFAULT.lease_key("fz-2")) == 1, 5.0, "its lease")
            frozen_at = time.monotonic()
            private_redis.freeze()
            try:
                probe.wait(lambda runs: runs[0].cancelled, 6.0, "the handler's cancel flag")
                cancelled_after_s = time.monotonic() - frozen_at
                time.sleep(max(0.0, 4.0 - cancelled_after_s))  # the fault itself: 4 s without Redis
            finally:
                private_redis.thaw()
            assert client.get(DEFAULT.lease_key("fz-2")) is None  # expired in Redis during the freeze
            successor = LeaseManager(client, consumer="successor", ttl_s=30).acquire("fz-2")
            assert not isinstance(successor, str) and successor.generation == 2
            successor_ready.set()
            probe.wait(lambda runs: runs[0].ended_at_s is not None, 5.0, "the old handler returning")
            # The worker dropped the task without settling it: nothing is acked or released.
            wait_for(lambda: not w.worker.inflight and w.worker.settler.backlog == 0, 5.0, "task dropped")
            assert w.worker.counters.leases_lost == 1 and w.worker.counters.completed == 0
            assert pending_count(client) == 1
        (run,) = probe.snapshot()
        assert run.fencing_token == 1 and run.cancelled
        assert cancelled_after_s < 2.0 + 2.5, f"cancel flag set {cancelled_after_s:.2f} s into the freeze"
        _assert_only_the_successor_writes(client, run, successor, state_key, mid)
        client.close()


def _assert_only_the_successor_writes(client: redis.Redis, run: Run, successor: Any, state_key: str, mid: str) -> None:
    """The frozen holder's write was refused, the successor's goes through, the entry stays pending."""
    assert run.extra["fenced_write"] is False
    assert client.get(state_key) is None
    assert fenced_set(client, "fz-2", successor.generation, state_key, "fresh")
    assert client.get(state_key) == b"fresh"
    assert [m.decode() for m, _f in client.xrange(QUEUE)] == [mid]
    assert pending_count(client) == 1
    assert client.get(DEFAULT.lease_key("fz-2")) == successor.value.encode()


class TestAcquireScript:
    """The acquire and release scripts on hostile and leftover keys (one call per batch)."""

    def test_bad_keys_are_refused_one_by_one_and_the_rest_of_the_batch_is_leased(self, bclient: redis.Redis) -> None:
        """Wrong types, a fence that is no decimal integer and a lease without TTL each refuse
        their own execution with a '!' reason; the good ones in the same call are leased."""
        bclient.hset(DEFAULT.lease_key("hash-lease"), "a", "b")
        bclient.rpush(DEFAULT.fence_key("list-fence"), "1")
        for i, text in enumerate(("five", "1.5", "-3", "0x10", " 7", "", "1234567890123456")):
            bclient.set(DEFAULT.fence_key(f"bad-fence-{i}"), text)
        bclient.set(DEFAULT.lease_key("no-ttl"), "garbage")
        bad = ["hash-lease", "list-fence", *(f"bad-fence-{i}" for i in range(7)), "no-ttl"]
        leases = LeaseManager(bclient, consumer="w1", ttl_s=10)
        got = leases.acquire_many(["good-1", *bad, "good-2"])
        assert [g.generation for g in (got[0], got[-1]) if not isinstance(g, str)] == [1, 1]
        reasons = got[1:-1]
        assert reasons[:2] == ["!wrongtype lease=hash fence=none", "!wrongtype lease=none fence=list"]
        assert reasons[2:9] == ["!fence is not an integer"] * 7
        assert reasons[9] == "!no ttl: garbage"
        assert bclient.type(DEFAULT.lease_key("hash-lease")) == b"hash"  # nothing touched
        assert bclient.get(DEFAULT.fence_key("bad-fence-0")) == b"five"
        assert bclient.pttl(DEFAULT.lease_key("no-ttl")) == -1
        assert bclient.exists(DEFAULT.fence_key("hash-lease"), DEFAULT.lease_key("list-fence")) == 0  # none left

    def test_a_key_of_another_type_is_reported_before_a_holder_or_takeover(self, bclient: redis.Redis) -> None:
        """The fence of a held or taken-over lease is a hash: a '!' refusal, the lease untouched."""
        old = LeaseManager(bclient, consumer="w1", ttl_s=10)
        held = [old.acquire(e) for e in ("by-other", "by-previous")]
        assert not isinstance(held[0], str) and not isinstance(held[1], str)
        for e in ("by-other", "by-previous"):
            bclient.delete(DEFAULT.fence_key(e))
            bclient.hset(DEFAULT.fence_key(e), "a", "b")
        restarted = LeaseManager(bclient, consumer="w1", ttl_s=10)
        assert LeaseManager(bclient, consumer="w2", ttl_s=10).acquire("by-other") == (
            "!wrongtype lease=string fence=hash"
        )
        assert restarted.acquire("by-previous") == "!wrongtype lease=string fence=hash"
        assert bclient.get(DEFAULT.lease_key("by-previous")) == held[1].value.encode()

    def test_a_second_task_of_an_execution_in_the_same_batch_is_refused_like_ours(self, bclient: redis.Redis) -> None:
        leases = LeaseManager(bclient, consumer="w1", ttl_s=10)
        first, second, other = leases.acquire_many(["d", "d", "x"])
        assert not isinstance(first, str) and first.generation == 1 and second == first.value
        assert not isinstance(other, str) and other.generation == 1
        assert bclient.get(DEFAULT.fence_key("d")) == b"1"

    def test_generations_continue_the_fence_and_both_keys_get_their_ttl(self, bclient: redis.Redis) -> None:
        """A fence left by earlier acquires (or an older worker's INCR) goes on from its value."""
        bclient.set(DEFAULT.fence_key("e1"), "41")
        bclient.set(DEFAULT.fence_key("e2"), "007")  # still a decimal integer
        leases = LeaseManager(bclient, consumer="w1", ttl_s=10)
        e1, e2 = leases.acquire_many(["e1", "e2"])
        assert not isinstance(e1, str) and not isinstance(e2, str)
        assert (e1.generation, e2.generation) == (42, 8)
        assert bclient.get(DEFAULT.lease_key("e1")) == f"{leases.holder}:42".encode() == e1.value.encode()
        assert bclient.get(DEFAULT.fence_key("e1")) == b"42"
        assert 9_000 < bclient.pttl(DEFAULT.lease_key("e1")) <= 10_000
        assert FENCE_TTL_S - 60 < bclient.ttl(DEFAULT.fence_key("e1")) <= FENCE_TTL_S
        assert leases.release(e1)
        assert leases.acquire_many(["e1"])[0] == Lease("e1", DEFAULT.lease_key("e1"), f"{leases.holder}:43", 43)

    def test_release_and_renew_skip_keys_of_other_types_and_other_values(self, bclient: redis.Redis) -> None:
        """Compare-and-delete and compare-and-extend touch only a lease holding the exact value."""
        leases = LeaseManager(bclient, consumer="w1", ttl_s=10)
        mine = leases.acquire("e1")
        assert not isinstance(mine, str)
        bclient.hset(DEFAULT.lease_key("e2"), "a", "b")
        bclient.set(DEFAULT.lease_key("e3"), f"{leases.holder}:9", px=10_000)
        others = [Lease("e2", DEFAULT.lease_key("e2"), "x", 1), Lease("e3", DEFAULT.lease_key("e3"), "x", 1)]
        assert leases.renew_many([*others, mine]) == [False, False, True]
        assert not leases.release(others[0]) and not leases.release(others[1])
        assert bclient.type(DEFAULT.lease_key("e2")) == b"hash" and bclient.exists(DEFAULT.lease_key("e3")) == 1
        assert not leases.release_orphan("e2")
        assert leases.release_orphan("e3")  # ours, whatever the generation
        assert leases.release(mine) and not leases.release(mine)
        assert bclient.exists(DEFAULT.lease_key("e1")) == 0
