"""Tenant namespaces: a body's ``tenant_id`` puts its execution under ``plaita:<tenant>:…`` (the
original's layout). The same execution id in two tenants is two executions (state, lease, cancel
flag, indexes); resuming or cancelling one never touches the other; the default tenant's keys are
exactly those of before; a hostile tenant id goes to the DLQ; the keeper keeps every tenant.
The key layout itself, without a server: ``test_tenant_keys.py``."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from plaita.flows import Flow, FlowRunner
from plaita.flows.keeper.keeper import KeeperSettings
from plaita.flows.model.context import StepContext
from plaita.flows.model.execution import Execution
from plaita.flows.producer.client import FlowClient
from plaita.ops.keeper_build import build_keeper
from plaita.store.client import make_client
from plaita.store.executions.execution_io import create_now
from plaita.store.executions.store import ExecutionStore
from plaita.store.keyspace import DEFAULT, TENANTS_KEY
from plaita.store.leases import Lease
from plaita.store.streams.queue import StreamQueue
from tests.flows import flowdefs
from tests.flows.support import Harness, dlq, harness, resume, start
from tests.support.lease_workers import QUEUE, inproc_worker, settings, wait_for

# -- real workers --------------------------------------------------------------------------


@pytest.fixture
def worker(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[FlowClient, ExecutionStore]]:
    """An in-process worker running the test flows, and a producer of the default tenant."""
    monkeypatch.setenv("PLAITA_TEST_REDIS_URL", redis_url)
    client = make_client(redis_url, socket_timeout_s=5.0)
    store = ExecutionStore(client)
    runner = FlowRunner(flowdefs.FLOWS, store, cancel_poll_s=0.1)
    try:
        with (
            inproc_worker(settings(redis_url, "tenants-w", eager_leases=True), runner),
            FlowClient.from_url(redis_url, queue_name=QUEUE) as flows,
        ):
            yield flows, store
    finally:
        runner.close()
        client.close()


def _status(flows: FlowClient, eid: str) -> str | None:
    doc = flows.get(eid)
    return None if doc is None else str(doc["status"])


@pytest.mark.redis
def test_one_execution_id_in_two_tenants_is_two_executions(worker: tuple[FlowClient, ExecutionStore]) -> None:
    flows, store = worker
    t1, t2 = flows.for_tenant("t1"), flows.for_tenant("t2")
    for producer, name in ((flows, "dee"), (t1, "ann"), (t2, "bob")):
        assert producer.start("signup", {"name": name}, execution_id="same") == "same"
    for producer in (flows, t1, t2):
        wait_for(lambda p=producer: _status(p, "same") == "suspended", 10, "each tenant's execution suspended")
    states = [p.get("same")["state"]["user"] for p in (flows, t1, t2)]  # type: ignore[index]
    assert states == ["dee", "ann", "bob"]  # three documents, one per tenant

    t1.resume("same", "event", {"addr": "a@x"})
    assert t1.wait("same", 10)["state"]["email"] == {"addr": "a@x"}
    assert _status(t2, "same") == "suspended" and _status(flows, "same") == "suspended"

    t2.cancel("same")
    assert t2.wait("same", 10)["status"] == "cancelled"
    assert _status(flows, "same") == "suspended" and _status(t1, "same") == "completed"
    raw = store.client
    assert raw.exists("plaita:execution:cancel:same", "plaita:t1:execution:cancel:same") == 0
    for key in ("plaita:execution:same", "plaita:t1:execution:same", "plaita:t2:execution:same"):
        assert raw.type(key) == b"string"
    assert raw.smembers(TENANTS_KEY) == {b"t1", b"t2"}
    assert store.tenants() == ["t1", "t2"]
    # Listing by tenant reads the tenant's own status index.
    assert [d["state"]["user"] for d in store.for_tenant("t1").by_status("completed", 10)] == ["ann"]
    assert store.by_status("completed", 10) == [] and store.for_tenant("t2").counts()["cancelled"] == 1
    assert store.counts()["suspended"] == 1 and store.for_tenant("t1").counts()["suspended"] == 0


@pytest.mark.redis
def test_a_tenant_cannot_resume_what_only_another_tenant_has(worker: tuple[FlowClient, ExecutionStore]) -> None:
    flows, store = worker
    t1 = flows.for_tenant("t1")
    t1.start("signup", execution_id="only-t1")
    wait_for(lambda: _status(t1, "only-t1") == "suspended", 10, "t1's execution suspended")
    # What FlowClient would refuse (no such execution in t2), sent raw: the worker refuses it too.
    flows.queue.enqueue({**resume("only-t1", "event", {"x": 1}), "tenant_id": "t2"})
    flows.queue.enqueue({**start("bad", "ledger3"), "tenant_id": "a:b"})  # hostile: to the DLQ
    flows.queue.enqueue({**start("bad", "ledger3"), "tenant_id": "{p1}"})
    wait_for(lambda: len(dlq(store.client)) == 3, 10, "three dead letters")
    reasons = [str(d["reason"]) for d in dlq(store.client)]
    assert "unknown execution 'only-t1'" in reasons[0]
    assert "invalid tenant_id" in reasons[1] and "invalid tenant_id" in reasons[2]
    assert _status(t1, "only-t1") == "suspended" and store.client.exists("plaita:t2:execution:only-t1") == 0
    with pytest.raises(ValueError, match="invalid tenant_id"):
        flows.for_tenant("a:b")
    ok = flows.start("ledger3")  # the worker lives on
    assert flows.wait(ok, 10)["status"] == "completed"


# -- the lease and the reclaim ---------------------------------------------------------------


@pytest.mark.redis
def test_a_tenants_lease_blocks_only_the_tenants_execution(redis_url: str) -> None:
    raw = make_client(redis_url, socket_timeout_s=5.0)
    try:
        a = StreamQueue(raw, stream=QUEUE, group="g", consumer="a", dlq_key=f"{QUEUE}:dlq", dlq_max_len=10)
        b = StreamQueue(raw, stream=QUEUE, group="g", consumer="b", dlq_key=f"{QUEUE}:dlq", dlq_max_len=10)
        a.ensure_group()
        a.enqueue({"type": "resume", "execution_id": "x", "tenant_id": "t1"})
        a.enqueue({"type": "resume", "execution_id": "x"})
        assert len(a.read_new(10, 0)) == 2  # a dies holding both
        raw.set("plaita:t1:execution:lease:x", "worker:a@1:1", px=60_000)
        time.sleep(0.01)  # idle time > 0 ms, the claim threshold below (a real idle clock, not a sync)
        _, claimed, skipped = b.claim_unleased("0-0", 0, 10)
        # t1's entry waits for t1's lease; the default tenant's x has no lease of its own: claimed.
        assert skipped == 1 and [json.loads(e.fields["payload"]).get("tenant_id") for e in claimed] == [None]
        raw.delete("plaita:t1:execution:lease:x")
        raw.set("plaita:execution:lease:x", "worker:a@1:1", px=60_000)  # the default tenant's x is leased now
        _, claimed, skipped = b.claim_unleased("0-0", 0, 10)
        assert skipped == 1 and [json.loads(e.fields["payload"])["tenant_id"] for e in claimed] == ["t1"]
    finally:
        raw.close()


# -- the keeper --------------------------------------------------------------------------------


def _orphan(h: Harness, store: ExecutionStore, eid: str) -> None:
    """A running execution of ``store``'s tenant with no lease and no task (its worker died)."""
    lease = h.leases.acquire_many([eid], [store.ks])[0]
    assert isinstance(lease, Lease) and lease.key == store.ks.lease_key(eid)
    doc = Execution.start(eid, h.runner.flows.get("ledger3"), {}, dedup_key=None, now_s=time.time()).to_doc()  # type: ignore[arg-type]
    assert create_now(store, eid, lease.generation, json.dumps(doc), doc["created_at"], None)[0] == 1
    h.leases.release(lease)


@pytest.mark.redis
def test_the_keeper_keeps_every_tenant(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLAITA_TEST_REDIS_URL", redis_url)
    with harness(redis_url) as h:
        t1 = h.store.for_tenant("t1")
        for store in (h.store, t1):
            _orphan(h, store, "o1")
            _orphan(h, store, "o2")
        queued = {"type": "resume", "execution_id": "o2", "resume_type": "event", "tenant_id": "t1"}
        h.queue.enqueue(queued)  # t1's o2 has a task waiting: no retry for it, but one for the default's o2
        settings_ = KeeperSettings(interval_s=0.1, orphan_grace_s=0.0, lease_ttl_s=2.0, retry_cooldown_s=60)
        offset_s = [0.0]
        keeper = build_keeper(h.store, h.queue, settings_, clock=lambda: time.time() + offset_s[0])
        report = keeper.run_once()
        assert report.retries == ["o1", "o2", "t1/o1"]
        bodies = [json.loads(f[b"payload"]) for _, f in h.client.xrange(QUEUE)]  # type: ignore[union-attr]
        assert [(b["execution_id"], b["resume_type"], b.get("tenant_id")) for b in bodies] == [
            ("o2", "event", "t1"),
            ("o1", "retry", None),
            ("o2", "retry", None),
            ("o1", "retry", "t1"),
        ]
        assert h.client.exists("plaita:execution:keeper-retry:o1", "plaita:t1:execution:keeper-retry:o1") == 2
        # A tenant's suspension past its deadline times out with the tenant's body.
        doc = h.run({**start("s1", "signup", timeout_s=0.01), "tenant_id": "t1"})
        assert doc is not None and doc["status"] == "suspended" and h.store.get("s1") is None
        offset_s[0] = 5.0
        later = keeper.run_once()
        assert later.timeouts == ["t1/s1"]
        last = json.loads(h.client.xrevrange(QUEUE, count=1)[0][1][b"payload"])  # type: ignore[index]
        assert (last["execution_id"], last["resume_type"], last["tenant_id"]) == ("s1", "timeout", "t1")


# -- every key of a tenant's execution ---------------------------------------------------------

keys_flow = Flow("tenant-keys")
child_flow = Flow("tenant-keys-child")
#: Every key in Redis, snapshot from inside the steps (while the lease is held).
_seen_keys: set[str] = set()
_snapshot_client: list[redis.Redis] = []


def _snapshot() -> None:
    _seen_keys.update(_snapshot_client[0].scan_iter(count=1000))


@keys_flow.step
def published(ctx: StepContext) -> Any:
    ctx.publish("progress", {"done": 1})
    _snapshot()
    return ctx.suspend(timeout_s=300) if ctx.resume is None else None


@keys_flow.step
def fanned(ctx: StepContext) -> Any:
    _snapshot()
    return ctx.spawn("tenant-keys-child", [{}]) if ctx.children is None else None


@keys_flow.step
def finished(ctx: StepContext) -> str:
    ctx.publish("result", {"ok": True})
    _snapshot()
    return "done"


@child_flow.step
def only(ctx: StepContext) -> str:
    ctx.publish("child", {"ok": True})
    _snapshot()
    return "ok"


def _queued(h: Harness) -> list[dict[str, Any]]:
    """The bodies the runner enqueued on its store's queue (emptied: each is run by hand)."""
    stream = h.store.ks.stream(0)
    bodies = [json.loads(f[b"payload"]) for _, f in h.client.xrange(stream)]  # type: ignore[union-attr]
    h.client.delete(stream)
    return bodies


@pytest.mark.redis
def test_every_key_of_a_tenants_execution_is_in_the_tenants_namespace(redis_url: str) -> None:
    """Guards issue 31: a tenant's execution, through its whole life (a dedup key, a published
    event, a suspension with a deadline, a child and its join, the end, a cancel flag), writes
    no key outside ``plaita:<tenant>:`` but the platform's queue and tenant list. The bugs put
    in by hand (the events key built without the tenant's ns, or published through the default
    tenant's store) left ``plaita:execution:events:…`` in the default tenant's namespace and
    the whole suite passed. Ids with ':' (escaped in keys) and the Keyspace's own methods name
    the keys expected."""
    client = redis.Redis.from_url(redis_url, decode_responses=True, socket_timeout=5)
    _seen_keys.clear()
    _snapshot_client[:] = [client]
    eid, tenant = "ord:1", "t1"
    ks = DEFAULT.for_tenant(tenant)
    h = Harness(redis_url, flows=[keys_flow, child_flow])
    try:
        body = {**start(eid, "tenant-keys"), "tenant_id": tenant, "dedup_key": "order:1"}
        assert h.run(body)["status"] == "suspended"  # type: ignore[index]
        assert h.run({**resume(eid, "event"), "tenant_id": tenant})["status"] == "suspended"  # type: ignore[index]
        children = _queued(h)
        assert [(b["flow_id"], b["tenant_id"]) for b in children] == [("tenant-keys-child", tenant)]
        h.run(children[0])
        (wake,) = _queued(h)
        assert h.run(wake)["status"] == "completed"  # type: ignore[index]
        assert h.run({**start("ord:2", "tenant-keys"), "tenant_id": tenant})["status"] == "suspended"  # type: ignore[index]
        h.flows.for_tenant(tenant).cancel("ord:2")  # a cancel flag of the tenant's
        _snapshot()
    finally:
        h.close()
        client.close()
    p = ks.partition_of(eid)
    expected = {
        ks.lease_key(eid),
        ks.fence_key(eid),
        ks.execution_key(eid),
        ks.events_key(eid),
        ks.dedup_key(p, "order:1"),
        ks.status_key(p, "completed"),
        ks.deadlines_key(p),
        ks.index_keeps_key(p),
        ks.execution_key(f"{eid}:fanned:0:0"),
        ks.events_key(f"{eid}:fanned:0:0"),
        ks.cancel_key("ord:2"),
    }
    assert expected <= _seen_keys, sorted(expected - _seen_keys)  # the life above touched each
    # The streams, the tenant list and the lease generation counter (lease format v2: shared by every
    # tenant's leases of a partition) are not per tenant.
    platform = {QUEUE, DEFAULT.stream(0), TENANTS_KEY, DEFAULT.generation_key(0)}
    outside = {k for k in _seen_keys if not k.startswith(ks.ns + ":")} - platform
    assert not outside, sorted(outside)
