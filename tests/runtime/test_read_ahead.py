"""Reading ahead while a batch's leases are acquired (``ConsumePhases.read``), on real Redis.

With a backlog of leased tasks the owner reads the next batch before the current batch's acquire
goes out, and parses it while redis-server runs the script. A batch is then read but neither in
flight nor settling; these tests check that such a batch is never run twice and never stranded,
whichever call fails: every task runs exactly once, and no lease is left behind.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis

from plaita.runtime.consume import ConsumePhases
from plaita.store.keyspace import DEFAULT
from plaita.store.leases import Lease, PendingAcquire
from plaita.store.streams.queue import StreamQueue
from tests.support.lease_workers import QUEUE, Probe, inproc_worker, pending_count, settings, wait_for

pytestmark = pytest.mark.redis

TASKS = 600


@pytest.fixture
def reads_ahead(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Sizes of the batches read ahead (a spy on the real method)."""
    sizes: list[int] = []
    real = ConsumePhases._read_ahead

    def spy(self: ConsumePhases, batch: Any) -> list[Any]:
        got = real(self, batch)
        if got:
            sizes.append(len(got))
        return got

    monkeypatch.setattr(ConsumePhases, "_read_ahead", spy)
    return sizes


def backlog(client: redis.Redis, n: int = TASKS) -> list[str]:
    """``n`` leased tasks (one execution each) in the stream before any worker reads."""
    pipe = client.pipeline(transaction=False)
    for i in range(n):
        body = {"type": "start", "flow_id": "f", "execution_id": f"e{i}", "params": {"n": i}}
        pipe.xadd(QUEUE, {"payload": json.dumps(body), "schema_version": "1"})
    return [mid.decode() for mid in pipe.execute()]


def run_all(redis_url: str, bclient: redis.Redis, probe: Probe, ids: list[str]) -> None:
    """Run a fast worker over the backlog until every task is acked; each must run exactly once."""
    s = settings(redis_url, "ahead", concurrency=2, prefetch=256)
    with inproc_worker(s, probe) as w:
        probe.wait(lambda runs: len({r.message_id for r in runs}) >= len(ids), 20.0, "every task run")
        wait_for(lambda: pending_count(bclient) == 0 and bclient.xlen(QUEUE) == 0, 10.0, "every task acked")
        assert w.worker.counters.lease_conflicts == 0
    ran = [r.message_id for r in probe.snapshot()]
    assert sorted(ran) == sorted(ids)  # each exactly once
    assert not list(bclient.scan_iter(match=DEFAULT.lease_key("*")))  # every lease released


def test_a_leased_backlog_is_read_ahead_and_runs_each_task_once(
    redis_url: str, bclient: redis.Redis, reads_ahead: list[int]
) -> None:
    ids = backlog(bclient)
    probe = Probe(sleeps=False)
    run_all(redis_url, bclient, probe, ids)
    assert reads_ahead, "the owner never read ahead"
    assert {r.delivery_count for r in probe.snapshot()} == {1}
    assert {r.fencing_token for r in probe.snapshot()} == {1}


def test_a_lost_acquire_reply_leaves_the_batch_read_ahead_to_the_own_pending_scan(
    redis_url: str, bclient: redis.Redis, reads_ahead: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first acquire runs in Redis but its reply is lost while the next batch is read ahead:
    both batches are re-read by RESUMING_OWN and run once, the orphan leases are released."""
    real = PendingAcquire.result
    lost: list[list[Lease | str]] = []

    def reply_lost_once(self: PendingAcquire) -> list[Lease | str]:
        got = real(self)  # the script ran: its leases exist
        if not lost and reads_ahead:
            lost.append(got)
            raise redis.exceptions.ConnectionError("injected: reply lost")
        return got

    monkeypatch.setattr(PendingAcquire, "result", reply_lost_once)
    ids = backlog(bclient)
    probe = Probe(sleeps=False)
    run_all(redis_url, bclient, probe, ids)
    assert lost and all(isinstance(g, Lease) for g in lost[0])
    orphaned = {g.execution_id for g in lost[0] if isinstance(g, Lease)}
    runs = probe.snapshot()
    # Leased again after the orphan release: a later generation, on the re-read (second) delivery.
    assert {r.fencing_token for r in runs if r.execution_id in orphaned} == {2}
    assert {r.delivery_count for r in runs if r.execution_id in orphaned} == {2}
    # The batch read ahead never asked for its leases: re-read too, leased once.
    first_ahead = {f"e{i}" for i in range(len(orphaned), len(orphaned) + reads_ahead[0])}
    assert {r.fencing_token for r in runs if r.execution_id in first_ahead} == {1}
    assert {r.delivery_count for r in runs if r.execution_id in first_ahead} == {2}


def test_a_failed_read_ahead_still_starts_the_batch_already_read(
    redis_url: str, bclient: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The read ahead fails: the batch read before it is leased and started at once (first
    delivery), not left in the pending list until the outage is over."""
    real = StreamQueue.read_new
    failed: list[int] = []

    def fail_once_without_block(self: StreamQueue, count: int, block_ms: int) -> Any:
        if block_ms == 0 and not failed:
            failed.append(count)
            raise redis.exceptions.ConnectionError("injected: read ahead failed")
        return real(self, count, block_ms)

    monkeypatch.setattr(StreamQueue, "read_new", fail_once_without_block)
    ids = backlog(bclient)
    probe = Probe(sleeps=False)
    run_all(redis_url, bclient, probe, ids)
    assert failed
    first = [r for r in probe.snapshot() if int(r.execution_id[1:]) < 128]
    assert first and {r.delivery_count for r in first} == {1}
