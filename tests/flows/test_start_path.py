"""Issue 31, items 1 and 2: the start path. A start with a live dedup key answers with the id of the
execution that holds it (one script: concurrent starts with one key get one id), and a start is
recorded ``queued`` at once (document and status index) until a worker takes it over.

One runner fed by hand under a real lease, a real private redis-server (``tests.flows.support``).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from plaita.errors import BadTaskError, NotForThisWorker
from plaita.flows.model.execution import Execution
from plaita.flows.producer.client import DuplicateStart, ExecutionNotFound
from tests.flows.flowdefs import FLOWS
from tests.flows.support import Harness
from tests.flows.test_cli import plaita

pytestmark = pytest.mark.redis

#: Concurrent starts racing for one dedup key.
RACERS = 8
#: The bound of every wait of these tests.
WAIT_S = 10.0


@pytest.fixture
def h(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    monkeypatch.setenv("PLAITA_TEST_REDIS_URL", redis_url)
    harness = Harness(redis_url, flows=FLOWS)
    try:
        yield harness
    finally:
        harness.close()


def stream_bodies(h: Harness) -> list[dict[str, Any]]:
    return [json.loads(f[b"payload"]) for _, f in h.client.xrange(h.queue.stream)]  # type: ignore[union-attr]


def queued_ids(h: Harness) -> list[str]:
    return [m.decode() for m in h.client.zrange(h.store.ks.status_key(0, "queued"), 0, -1)]  # type: ignore[union-attr]


# -- item 1: one dedup key, one id ---------------------------------------------------------------
def test_two_starts_with_one_dedup_key_return_the_same_id_and_enqueue_once(h: Harness) -> None:
    """Item 1. Before: the second start returned a new id that never got an execution (``wait`` on
    it hung until its timeout), and a second start task was enqueued."""
    first = h.flows.start("ledger3", {}, dedup_key="order-7")
    second = h.flows.start("ledger3", {}, dedup_key="order-7")
    assert second == first
    assert [b["execution_id"] for b in stream_bodies(h)] == [first]
    with pytest.raises(DuplicateStart) as raised:  # the documented way to be told
        h.flows.start("ledger3", {}, dedup_key="order-7", on_duplicate="raise")
    assert raised.value.execution_id == first and "order-7" in str(raised.value)
    doc = h.run(stream_bodies(h)[0])
    assert doc is not None and doc["status"] == "completed"
    assert h.flows.wait(second, WAIT_S)["execution_id"] == first  # the id a duplicate got has an end


def test_concurrent_starts_with_one_dedup_key_get_one_id(h: Harness) -> None:
    """Item 1: the dedup answer is atomic. Before: each racer read the key unset and got its own id."""
    barrier = threading.Barrier(RACERS)
    ids: list[str] = []
    lock = threading.Lock()

    def racer() -> None:
        barrier.wait(WAIT_S)
        eid = h.flows.start("ledger3", {}, dedup_key="race")
        with lock:
            ids.append(eid)

    threads = [threading.Thread(target=racer) for _ in range(RACERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S)
    assert len(ids) == RACERS and len(set(ids)) == 1, ids
    assert [b["execution_id"] for b in stream_bodies(h)] == ids[:1]


def test_a_dedup_key_first_used_by_an_older_producer_still_answers(h: Harness) -> None:
    """Item 1, compatibility: a key a worker's create recorded (a start without a record, from a
    producer older than this) is answered the same way."""
    h.run({"type": "start", "flow_id": "ledger3", "execution_id": "old-1", "params": {}, "dedup_key": "k-old"})
    assert h.flows.start("ledger3", {}, dedup_key="k-old") == "old-1"
    assert stream_bodies(h) == []


# -- item 2: a start is visible at once ----------------------------------------------------------
def test_a_start_is_recorded_queued_at_once_and_taken_over_by_the_worker(h: Harness) -> None:
    """Item 2. Before: ``get`` right after ``start`` returned None (queued and unknown looked the
    same), ``list`` and the counts did not show it."""
    eid = h.flows.start("ledger3", {"n": 1}, dedup_key="seen")
    doc = h.flows.get(eid)
    assert doc is not None and doc["status"] == "queued" and doc["params"] == {"n": 1}
    assert Execution.decode(doc).status == "queued"  # a real status of the typed record
    assert queued_ids(h) == [eid] and h.store.counts()["queued"] == 1
    assert [d["execution_id"] for d in h.store.by_status("queued", 10)] == [eid]
    doc = h.run(stream_bodies(h)[0])  # the worker's create takes the record over, atomically
    assert doc is not None and doc["status"] == "completed" and doc["steps_run"] == 3
    assert queued_ids(h) == [] and h.store.counts()["queued"] == 0
    assert h.client.zscore(h.store.ks.status_key(0, "completed"), eid) is not None


def test_a_start_of_an_existing_execution_keeps_its_document(h: Harness) -> None:
    """Item 2: a start of an id that has a document is enqueued as before (a no-op for the worker),
    and never turns that document back into a queued record."""
    h.run({"type": "start", "flow_id": "ledger3", "execution_id": "done-1", "params": {}})
    assert h.flows.start("ledger3", {}, execution_id="done-1") == "done-1"
    doc = h.flows.get("done-1")
    assert doc is not None and doc["status"] == "completed" and queued_ids(h) == []
    assert h.run(stream_bodies(h)[0]) == doc


def test_a_resume_of_a_queued_execution_is_refused_and_leaves_the_record(h: Harness) -> None:
    """Item 2: a queued record is no execution a step ran. A resume of it is refused by the
    producer as before (ExecutionNotFound) and by a worker (a raw task: to the DLQ), which must not
    end the record (a definition check against a record with no fingerprint would)."""
    eid = h.flows.start("signup", {"name": "ann"}, execution_id="early")
    with pytest.raises(ExecutionNotFound, match="queued"):
        h.flows.resume(eid, "event", "yes")
    with pytest.raises(BadTaskError, match="queued"):
        h.run({"type": "resume", "execution_id": eid, "resume_type": "event", "data": "yes"})
    doc = h.flows.get(eid)
    assert doc is not None and doc["status"] == "queued" and queued_ids(h) == [eid]


def test_a_tenants_first_start_registers_the_tenant(h: Harness) -> None:
    """Item 2, tenants: the tenant's counts (dashboard overview, stats) find its queued starts before
    any worker created one of its executions."""
    t7 = h.flows.for_tenant("t7")
    eid = t7.start("ledger3", {}, dedup_key="same")
    assert h.store.tenants() == ["t7"] and h.store.for_tenant("t7").counts()["queued"] == 1
    assert t7.start("ledger3", {}, dedup_key="same") == eid and h.flows.start("ledger3", {}, dedup_key="same") != eid
    assert (t7.get(eid) or {}).get("status") == "queued" and h.flows.get(eid) is None


def test_executions_list_and_show_print_a_queued_start(h: Harness, redis_url: str) -> None:
    """Item 2: ``plaita executions list --status queued`` and ``show`` see a start no worker read."""
    eid = h.flows.start("ledger3", {}, execution_id="q-cli")
    listed = plaita(redis_url, "executions", "list", "--status", "queued", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [(r["execution_id"], r["status"]) for r in json.loads(listed.stdout)] == [(eid, "queued")]
    shown = plaita(redis_url, "executions", "show", eid)
    assert shown.returncode == 0 and "status queued" in shown.stdout, shown.stdout + shown.stderr


# -- item 3: a start asking for a version no live worker runs waits for one ---------------------
class Clock:
    """The runner's wall clock, moved by the test (the version wait is counted on it)."""

    def __init__(self) -> None:
        self.now_s = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now_s


def test_a_start_for_a_version_no_worker_runs_waits_then_is_dead_lettered_with_the_reason(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 3. Before: the start went to the DLQ at once (BadTaskError "version '2' requested").
    Now it is handed back with a growing delay, its record shows what it waits for, and only past
    ``version_wait_s`` is it dead-lettered, its record ended ``error`` with the reason."""
    monkeypatch.setenv("PLAITA_TEST_REDIS_URL", redis_url)
    clock = Clock()
    h = Harness(redis_url, flows=FLOWS, clock=clock, version_wait_s=60.0)
    try:
        eid = h.flows.start("ledger3", {}, version="2")
        body = stream_bodies(h)[0]
        delays = []
        for _ in range(3):
            with pytest.raises(NotForThisWorker) as handed:
                h.run(body)
            assert handed.value.hand_back and "version '2'" in handed.value.reason
            delays.append(handed.value.delay_s)
            clock.now_s += 20.0
        assert delays == sorted(delays) and delays[0] < delays[-1]  # a growing delay
        doc = h.flows.get(eid)
        assert doc is not None and doc["status"] == "queued", doc
        assert doc["waiting"]["version"] == "2" and doc["waiting"]["until"] - doc["waiting"]["since"] == 60.0
        with pytest.raises(BadTaskError) as dead:  # 60 s after the first try: to the DLQ
            h.run(body)
        assert "no live worker runs it" in dead.value.reason and "waited 60 s" in dead.value.reason
        doc = h.flows.get(eid)
        assert doc is not None and doc["status"] == "error" and doc["error"]["type"] == "DeadLettered"
        assert queued_ids(h) == [] and h.client.ttl(h.store.ks.execution_key(eid)) > 0  # cleaned up
        assert h.flows.wait(eid, WAIT_S)["status"] == "error"  # a wait ends instead of timing out
    finally:
        h.close()


def test_a_queued_record_is_rewritten_only_under_the_lease_and_only_while_queued(h: Harness) -> None:
    """Items 2 and 3: the worker's rewrite of a queued record (what it waits for, its dead-lettered
    end) is fenced like a checkpoint and never touches a record a worker took over."""
    eid = h.flows.start("ledger3", {}, execution_id="rw")
    task, lease = h.task(stream_bodies(h)[0])
    try:
        doc = h.flows.get(eid)
        assert doc is not None
        ended = json.dumps({**doc, "status": "error"})
        assert not h.store.rewrite_queued(eid, task.fencing_token + 1, ended, "error", 1.0, 60)  # fenced out
        assert (h.flows.get(eid) or {}).get("status") == "queued" and queued_ids(h) == [eid]
        assert h.store.rewrite_queued(eid, task.fencing_token, ended, "error", 1.0, 60)
        assert queued_ids(h) == [] and h.client.zscore(h.store.ks.status_key(0, "error"), eid) is not None
        assert 0 < h.client.ttl(h.store.ks.execution_key(eid)) <= 60
        assert not h.store.rewrite_queued(eid, task.fencing_token, json.dumps(doc), "queued", 2.0, 0)  # not queued
        assert (h.flows.get(eid) or {}).get("status") == "error"
    finally:
        h.leases.release(lease)


def test_a_queued_record_no_worker_takes_over_expires_with_its_dedup_key(h: Harness) -> None:
    """Item 2, clean-up: a record whose task is lost (dead-lettered before its handler ran) must not
    show ``queued`` for ever. It lives as long as its dedup key; the create removes the expiry, and
    the index entries of expired records go with a later start."""
    eid = h.flows.start("ledger3", {}, dedup_key="ttl")
    key = h.store.ks.execution_key(eid)
    assert 6 * 86400 < h.client.ttl(key) <= 7 * 86400
    index = h.store.ks.status_key(0, "queued")
    h.client.zadd(index, {"long-gone": 1.0})  # an entry of a record that expired a week ago
    h.flows.start("ledger3", {})
    assert b"long-gone" not in h.client.zrange(index, 0, -1)  # type: ignore[operator]
    doc = h.run(stream_bodies(h)[0])
    assert doc is not None and doc["status"] == "completed" and h.client.ttl(key) > 0  # terminal: its retention
    running = h.flows.start("signup", {"name": "ann"}, execution_id="no-expiry")
    assert (h.run(stream_bodies(h)[-1]) or {}).get("status") == "suspended"
    assert h.client.ttl(h.store.ks.execution_key(running)) == -1  # taken over: no expiry while it lives
