"""Issue 18: what the keeper promises, pinned one guarantee per test on a real Redis.

- ``--dry-run`` reads only: it never takes, renews or waits for ``plaita:keeper:lease``.
- ``--once`` fails (exit 1) when another keeper holds the lease or the pass failed, and always
  hands its own lease back.
- One corrupt or wrong-typed execution key is skipped, counted and logged once; the rest of
  the pass goes on, and it is never called a Redis failure.
- The execution guarantees the mutants of issue 18 broke silently: a timeout carries its
  suspension's number (mutant 3), a deadline survives a failed enqueue (4), a recovery retry
  is sent once per cooldown (5), every partition's running index is read (9).
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import pytest
import redis

from plaita.config import Settings
from plaita.flows import Flow, FlowRunner, StepContext
from plaita.flows.keeper.keeper import KeeperSettings
from plaita.flows.model.execution import Execution
from plaita.ops.keeper_build import build_keeper
from plaita.store.client import make_client
from plaita.store.executions.execution_io import create_now
from plaita.store.executions.keeper_store import KEEPER_LEASE_KEY
from plaita.store.executions.store import ExecutionStore
from plaita.store.leases import Lease, LeaseManager
from plaita.store.streams.partitioned import keyspace_of, open_queue
from plaita.store.streams.queue import StreamQueue
from tests.flows import flowdefs
from tests.flows.support import Harness, resume, start
from tests.support.lease_workers import QUEUE

pytestmark = pytest.mark.redis

FAST = KeeperSettings(interval_s=0.1, orphan_grace_s=0.0, lease_ttl_s=2.0, retry_cooldown_s=60)
DRY = KeeperSettings(interval_s=0.1, orphan_grace_s=0.0, lease_ttl_s=2.0, dry_run=True)
DEADLINES = "plaita:executions:deadlines"
RUNNING = "plaita:executions:status:running"


class Clock:
    """The keeper's wall clock, moved forward by hand (deadlines and cooldowns are wall-clock)."""

    def __init__(self) -> None:
        self.offset_s = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset_s


class FailingXadd(redis.Redis):
    """A real client whose XADD fails while ``failing`` is set, as a connection cut would."""

    failing = True

    def xadd(self, *args: Any, **kwargs: Any) -> Any:
        if self.failing:
            raise redis.ConnectionError("test: connection cut during XADD")
        return super().xadd(*args, **kwargs)


def queued(client: redis.Redis, stream: str = QUEUE) -> list[dict[str, Any]]:
    return [json.loads(f[b"payload"]) for _, f in client.xrange(stream)]  # type: ignore[union-attr]


def make_orphan(store: ExecutionStore, leases: LeaseManager, eid: str, *, age_s: float = 0.0) -> None:
    """A running execution whose worker died before its first step: state, no task, no lease."""
    lease = leases.acquire(eid)
    assert isinstance(lease, Lease)
    doc = Execution.start(eid, flowdefs.ledger3, {}, dedup_key=None, now_s=time.time() - age_s).to_doc()
    code, _, _ = create_now(store, eid, lease.generation, json.dumps(doc), doc["created_at"], None)
    assert code == 1
    leases.release(lease)


def plant_bad_keys(client: redis.Redis, index: str, score: float) -> list[str]:
    """Three unreadable executions in ``index``: not JSON, JSON but not an object, not a string."""
    client.set("plaita:execution:a-corrupt", "garbage{")
    client.set("plaita:execution:a-list", "[1, 2]")
    client.hset("plaita:execution:a-hash", "status", "suspended")
    bad = ["a-corrupt", "a-list", "a-hash"]
    client.zadd(index, {eid: score for eid in bad})
    return bad


# -- the lease: dry runs and --once -------------------------------------------------------
def test_dry_run_never_takes_renews_or_waits_for_the_lease(h: Harness) -> None:
    """Reproduction 5: a dry run took and renewed the lease, so no real keeper acted meanwhile;
    with another keeper holding it, the dry run reported nothing at all."""
    h.run(start("dl", "signup", timeout_s=0))
    dry = build_keeper(h.store, h.queue, DRY)
    assert dry.run_once().timeouts == ["dl"]
    assert h.client.exists(KEEPER_LEASE_KEY) == 0  # not taken
    h.client.set(KEEPER_LEASE_KEY, "keeper:other", px=60_000)
    report = dry.run_once()
    assert report.acting and report.timeouts == ["dl"]  # reads anyway: it never waits for the lease
    assert h.client.get(KEEPER_LEASE_KEY) == b"keeper:other"
    assert int(h.client.pttl(KEEPER_LEASE_KEY)) > 50_000  # not renewed either (that would be 2 s)
    assert dry.run(once=True) == 0
    assert h.client.get(KEEPER_LEASE_KEY) == b"keeper:other"  # and not released: it was never ours
    assert queued(h.client) == []


def test_once_fails_when_another_keeper_holds_the_lease(h: Harness, caplog: pytest.LogCaptureFixture) -> None:
    """Reproduction 5: ``keeper --once`` that could not take the lease exited 0 in silence."""
    h.client.set(KEEPER_LEASE_KEY, "keeper:other", px=60_000)
    caplog.set_level(logging.INFO, logger="plaita.flows.keeper.keeper")
    assert build_keeper(h.store, h.queue, FAST).run(once=True) == 1
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(lines) == 1 and KEEPER_LEASE_KEY in lines[0] and "keeper:other" in lines[0], lines
    assert h.client.get(KEEPER_LEASE_KEY) == b"keeper:other"


def test_once_hands_the_lease_back_when_the_pass_failed(h: Harness, redis_url: str) -> None:
    """Reproduction 5: a --once whose pass failed kept the lease for its whole TTL."""
    make_orphan(h.store, h.leases, "o1")
    faulty = FailingXadd.from_url(redis_url, socket_timeout=5.0)
    try:
        fqueue = StreamQueue(faulty, stream=QUEUE, group="plaita-workers", consumer="k", dlq_key="d", dlq_max_len=1)
        k = build_keeper(ExecutionStore(faulty), fqueue, FAST)
        assert k.run(once=True) == 1
        assert h.client.exists(KEEPER_LEASE_KEY) == 0  # handed back at once, not after 2 s
        assert build_keeper(h.store, h.queue, FAST).run_once().retries == ["o1"]
    finally:
        faulty.close()


# -- isolation: one bad key never stops a pass ---------------------------------------------
def test_corrupt_keys_in_the_deadlines_index_are_skipped_counted_logged_once(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    """Reproduction 6: one corrupt key re-armed the due batch and killed every pass before the
    other timeouts were enqueued, forever, logged as "Redis failed (JSONDecodeError ...)"."""
    bad = plant_bad_keys(h.client, DEADLINES, 1)
    h.run(start("good", "signup", timeout_s=0))
    caplog.set_level(logging.DEBUG, logger="plaita.flows.keeper.keeper")
    clock = Clock()
    k = build_keeper(h.store, h.queue, FAST, clock=clock)
    assert k.run(once=True) == 0
    assert [(t["execution_id"], t["resume_type"]) for t in queued(h.client)] == [("good", "timeout")]
    assert k.corrupt_skips == 3
    clock.offset_s = FAST.timeout_cooldown_s + 5  # the re-armed bad members are due again
    report = k.run_once()
    assert sorted(report.corrupt) == sorted(bad) and k.corrupt_skips == 6
    for eid in bad:  # nothing was lost: an operator can still repair them
        assert h.client.zscore(DEADLINES, eid) is not None
        assert h.client.exists(f"plaita:execution:{eid}") == 1
    messages = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not any("Redis failed" in m for m in messages), messages
    for eid in bad:
        assert len([m for m in messages if f"plaita:execution:{eid}" in m]) == 1, messages


def test_corrupt_keys_in_the_running_index_are_skipped(h: Harness) -> None:
    """Reproduction 6, running index: a zombie that is not JSON killed the orphan pass (the
    compare-and-set read it), and a young one was sent recovery retries no worker can run."""
    plant_bad_keys(h.client, RUNNING, time.time() - 7300)  # older than zombie_after_s
    h.client.set("plaita:execution:young-corrupt", "{nope")
    h.client.zadd(RUNNING, {"young-corrupt": time.time() - 60})
    make_orphan(h.store, h.leases, "zombie", age_s=7300)
    make_orphan(h.store, h.leases, "orphan", age_s=60)
    k = build_keeper(h.store, h.queue, KeeperSettings(interval_s=0.1, orphan_grace_s=0, lease_ttl_s=2))
    report = k.run_once()
    assert report.orphaned == ["zombie"] and report.retries == ["orphan"]
    assert sorted(report.corrupt) == ["a-corrupt", "a-hash", "a-list", "young-corrupt"]
    assert [t["execution_id"] for t in queued(h.client)] == ["orphan"]
    assert h.client.hget("plaita:execution:a-hash", "status") == b"suspended"  # untouched


def test_unreadable_keys_do_not_hide_the_orphans_behind_them(h: Harness) -> None:
    """More unreadable keys than a batch, all older than the orphan: the same pass goes on to it."""
    for i in range(5):
        h.client.set(f"plaita:execution:bad-{i}", "{")
        h.client.zadd(RUNNING, {f"bad-{i}": time.time() - 600 + i})
    make_orphan(h.store, h.leases, "behind", age_s=60)
    settings = KeeperSettings(interval_s=0.1, orphan_grace_s=0, lease_ttl_s=2, batch=2)
    report = build_keeper(h.store, h.queue, settings).run_once()
    assert report.retries == ["behind"] and len(report.corrupt) == 5


# -- the execution guarantees (issue 18 mutants 3, 4, 5, 9) ---------------------------------
twice = Flow("twice")


@twice.step
def ask(ctx: StepContext) -> Any:
    if ctx.resume is None:
        return ctx.suspend(timeout_s=0.0)  # due at once: the keeper times it out
    return {"ask": ctx.resume.type}


@twice.step
def ask_again(ctx: StepContext) -> Any:
    if ctx.resume is None:
        return ctx.suspend()  # no deadline: only an event may end this one
    return {"ask_again": ctx.resume.type}


def test_a_late_timeout_cannot_end_a_later_suspension(h: Harness) -> None:
    """Mutant 3: the keeper's timeout sent without the suspension's number."""
    runner = FlowRunner([twice], h.store)

    def run(body: dict[str, Any]) -> dict[str, Any] | None:
        task, lease = h.task(body)
        try:
            runner(task)
        finally:
            h.leases.release(lease)
        return h.store.get("tw")

    try:
        doc = run(start("tw", "twice"))
        assert doc is not None and doc["status"] == "suspended" and doc["suspension"]["seq"] == 1
        assert build_keeper(h.store, h.queue, FAST).run_once().timeouts == ["tw"]
        [late] = queued(h.client)  # the timeout of suspension 1, not yet run
        doc = run(resume("tw", "event", "first answer"))  # the event wins the race
        assert doc is not None and doc["status"] == "suspended" and doc["suspension"]["seq"] == 2
        doc = run(late)
        assert doc is not None and doc["status"] == "suspended" and doc["suspension"]["seq"] == 2
        assert doc["suspension"]["step"] == "ask_again"
    finally:
        runner.close()


def test_a_failed_timeout_enqueue_keeps_the_deadline(h: Harness, redis_url: str) -> None:
    """Mutant 4: the deadline removed before its timeout was enqueued is lost for good when the
    enqueue fails (here the connection is cut during XADD)."""
    h.run(start("lost", "signup", timeout_s=0))
    faulty = FailingXadd.from_url(redis_url, socket_timeout=5.0)
    try:
        fqueue = StreamQueue(faulty, stream=QUEUE, group="plaita-workers", consumer="k", dlq_key="d", dlq_max_len=1)
        clock = Clock()
        k = build_keeper(ExecutionStore(faulty), fqueue, FAST, clock=clock)
        with pytest.raises(redis.ConnectionError):
            k.run_once()
        assert queued(h.client) == [] and h.client.zscore(DEADLINES, "lost") is not None
        faulty.failing = False
        clock.offset_s = FAST.timeout_cooldown_s + 5  # past the re-arm: due again
        assert k.run_once().timeouts == ["lost"]
    finally:
        faulty.close()
    [task] = queued(h.client)
    doc = h.run(task)
    assert doc is not None and doc["state"]["resumed_by"] == "timeout"


def test_a_recovery_retry_is_sent_once_per_cooldown(h: Harness) -> None:
    """Mutant 5: the retry sent without its cooldown mark. The retry task is gone from the
    stream (its worker died and it went to the DLQ), so only the mark stops a retry per pass."""
    make_orphan(h.store, h.leases, "cool")
    k = build_keeper(h.store, h.queue, FAST)
    assert k.run_once().retries == ["cool"]
    [(message_id, _)] = h.client.xrange(QUEUE)  # type: ignore[misc]
    h.client.xdel(QUEUE, message_id)
    for _ in range(3):
        assert k.run_once().retries == []
    assert queued(h.client) == []
    assert 0 < int(h.client.ttl("plaita:execution:keeper-retry:cool")) <= FAST.retry_cooldown_s


def test_every_partition_of_the_running_index_is_read(redis_url: str) -> None:
    """Mutant 9: the running-index lookup reading partition 0 for every execution left every
    orphan of the other partitions alone (--partitions 3 on one server)."""
    settings = Settings(redis_url=redis_url, queue_name=QUEUE, partitions=3)
    client = make_client(redis_url, socket_timeout_s=5.0)
    try:
        ks = keyspace_of(settings)
        store, queue = ExecutionStore(client, ks), open_queue(settings, client=client)
        leases = LeaseManager(client, consumer="t", ttl_s=30.0, keyspace=ks)
        ids = {ks.partition_of(f"part-{i}"): f"part-{i}" for i in range(40)}
        assert sorted(ids) == [0, 1, 2]
        for eid in ids.values():
            make_orphan(store, leases, eid, age_s=60)
        zombie = next(f"z-{i}" for i in range(40) if ks.partition_of(f"z-{i}") == 2)
        make_orphan(store, leases, zombie, age_s=7300)
        report = build_keeper(store, queue, KeeperSettings(interval_s=0.1, orphan_grace_s=0, lease_ttl_s=2)).run_once()
        assert sorted(report.retries) == sorted(ids.values()) and report.orphaned == [zombie]
        doc = store.get(zombie)
        assert doc is not None and doc["status"] == "error"
        bodies = [json.loads(f[b"payload"]) for s in queue.streams for _, f in client.xrange(s)]  # type: ignore[union-attr]
        assert sorted(b["execution_id"] for b in bodies) == sorted(ids.values())
    finally:
        client.close()
