"""Issue 33 item 3 on one runner and a real redis-server: ``max_concurrent_per_key`` (a start whose
concurrency key is busy parks behind that key only, and runs in start order per key when the
key's slot frees), key names safe from user data, and limits changed at run time (the slot
scripts read the flow's limits record themselves: no restart)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from plaita.errors import BadTaskError, ConfigError, NotForThisWorker
from plaita.flows import Flow, LimitControl
from plaita.flows.producer.client import FlowClient
from plaita.store.executions.flow_limits import (
    FULL,
    RATE_LIMITED,
    TAKEN,
    flow_keys,
    key_scope,
)
from tests.flows.limitdefs import suspend_once
from tests.flows.support import Harness, harness, limits, resume, start
from tests.support.lease_workers import wait_for

pytestmark = pytest.mark.redis

charge = Flow("charge", max_concurrent_per_key=1, concurrency_key="customer_id")
by_account = Flow("by_account", max_concurrent_per_key=2, concurrency_key=lambda p: p["account"]["id"])
tunable = Flow("tunable", max_concurrent=1)
charge.step(name="wait_here")(suspend_once)
by_account.step(name="account_step")(suspend_once)
tunable.step(name="tune_step")(suspend_once)


@pytest.fixture
def h(redis_url: str) -> Iterator[Harness]:
    with harness(redis_url, flows=[charge, by_account, tunable], slot_ttl_s=30.0) as opened:
        yield opened


def hold(h: Harness, flow_id: str, member: str, *, limit: int = 1, key: str | None = None, ttl_s: float = 30) -> int:
    """Take a slot by hand (a running execution elsewhere): the acquire's code."""
    return (
        limits(h)
        .acquire(flow_id, member, "tok", max_concurrent=limit, ttl_s=ttl_s, starts_per_s=0, burst=1, key=key)
        .code
    )


def promoted(h: Harness) -> list[dict[str, Any]]:
    entries = h.client.xrange(h.store.ks.stream(0))
    return [json.loads(f[b"payload"]) for _, f in entries]  # type: ignore[union-attr]


def test_a_busy_key_parks_its_own_starts_in_order_and_no_other_keys(h: Harness) -> None:
    """Key ``c:1`` is held: its two starts park (nothing created), a start of key ``c:2`` runs at
    once; when the key frees, its starts run one at a time, oldest first (the second only once
    the first gave its slot back)."""
    assert hold(h, "charge", "holder", key="c:1") == TAKEN
    assert h.run(start("a2", "charge", customer_id="c:1"), message_id="1002-0") is None
    assert h.run(start("a1", "charge", customer_id="c:1"), message_id="1001-0") is None
    assert h.store.get("a1") is None and h.store.get("a2") is None
    assert h.run(start("b1", "charge", customer_id="c:2"), message_id="1003-0")["status"] == "suspended"  # type: ignore[index]
    assert limits(h).waiting("charge") == 2
    assert limits(h).release("charge", "holder", "tok", max_concurrent=1, ttl_s=30.0, key="c:1")
    assert [b["execution_id"] for b in promoted(h)] == ["a1"], "one slot: only the oldest start of the key"
    assert h.run(promoted(h)[-1])["status"] == "suspended"  # type: ignore[index]  # gives its slot back
    assert [b["execution_id"] for b in promoted(h)] == ["a1", "a2"]
    assert h.run(promoted(h)[-1])["status"] == "suspended"  # type: ignore[index]
    assert limits(h).waiting("charge") == 0


def test_a_key_function_and_a_per_key_limit_of_two(h: Harness) -> None:
    """``concurrency_key`` as a function of the params; two slots per key."""
    assert hold(h, "by_account", "x1", limit=2, key="7") == TAKEN
    assert hold(h, "by_account", "x2", limit=2, key="7") == TAKEN
    assert h.run(start("acc7", "by_account", account={"id": 7}), message_id="2001-0") is None
    assert h.run(start("acc8", "by_account", account={"id": 8}), message_id="2002-0")["status"] == "suspended"  # type: ignore[index]
    assert limits(h).waiting("by_account") == 1


def test_a_start_without_its_key_is_a_bad_task(h: Harness) -> None:
    with pytest.raises(BadTaskError, match="concurrency key"):
        h.run(start("nokey", "charge", other=1))
    assert h.store.get("nokey") is None


def test_a_dead_holders_key_slot_is_swept_to_its_parked_start(h: Harness) -> None:
    """The holder of a key's slot died (a 200 ms slot, not renewed): the sweep finds the key in the
    flow's set of keys with parked starts, gives the slot to its start, and once the key has no
    parked start it leaves that set."""
    assert hold(h, "charge", "dead", key="k", ttl_s=0.2) == TAKEN
    assert h.run(start("next", "charge", customer_id="k"), message_id="3001-0") is None
    scopes = limits(h).parked_keys("charge")
    assert scopes == [key_scope("k")]
    wait_for(lambda: _expired(h), 10.0, "the dead holder's slot expired")
    assert limits(h).promote_scope("charge", scopes[0], max_concurrent=1, ttl_s=30.0) == 1
    assert [b["execution_id"] for b in promoted(h)] == ["next"]
    assert h.run(promoted(h)[-1])["status"] == "suspended"  # type: ignore[index]
    assert limits(h).promote_scope("charge", scopes[0], max_concurrent=1, ttl_s=30.0) == 0
    assert limits(h).parked_keys("charge") == []


def _expired(h: Harness) -> bool:
    now_s, micros = h.client.time()
    score = h.client.zscore(flow_keys(h.store.ks, "charge", "k").slots, "dead")
    return score is None or score < now_s * 1000 + micros // 1000


def test_a_lowered_and_a_raised_limit_hold_at_the_next_acquire(h: Harness, redis_url: str) -> None:
    """The flow declares one slot. Raised to 2 at run time, a second slot is taken; lowered to 1,
    no third is (the two running ones keep theirs) and a start parks; raised to 3, the set call
    itself gives the parked start its slot (put back on its stream), no worker needed."""
    client = FlowClient.from_url(redis_url, queue_name=h.store.ks.queue)
    control = LimitControl(client, ttl_s=30.0)
    try:
        assert hold(h, "tunable", "r1") == TAKEN
        assert hold(h, "tunable", "r2") == FULL
        control.set("tunable", max_concurrent=2)
        assert hold(h, "tunable", "r2") == TAKEN
        control.set("tunable", max_concurrent=1)
        assert limits(h).release("tunable", "r2", "tok", max_concurrent=1, ttl_s=30.0)
        assert hold(h, "tunable", "r3") == FULL
        assert h.run(start("late", "tunable"), message_id="4001-0") is None
        assert promoted(h) == []
        control.set("tunable", max_concurrent=3)
        assert [b["execution_id"] for b in promoted(h)] == ["late"]
        (row,) = control.show("tunable")
        assert row["max_concurrent"] == 3 and row["running"] == 2 and row["waiting"] == 1
        assert control.clear("tunable") and not control.clear("tunable")
        assert control.show("tunable")[0]["max_concurrent"] is None
    finally:
        client.close()


def test_a_raised_start_rate_holds_at_the_next_start(h: Harness, redis_url: str) -> None:
    """A start rate of one per 100 s: the second start must wait; raised to 1000/s at run time,
    it passes within moments (the bucket refills at the new rate)."""

    def take(member: str) -> int:
        return limits(h).acquire("rated", member, member, max_concurrent=0, ttl_s=30, starts_per_s=0.01, burst=1).code

    client = FlowClient.from_url(redis_url, queue_name=h.store.ks.queue)
    try:
        assert take("s1") == TAKEN
        assert take("s2") == RATE_LIMITED
        LimitControl(client).set("rated", max_starts_per_s=1000)
        deadline = time.monotonic() + 10
        while take("s2") != TAKEN:
            assert time.monotonic() < deadline, "the raised rate never let the start pass"
            time.sleep(0.01)
    finally:
        client.close()


def test_bad_run_time_limits_are_refused(redis_url: str) -> None:
    client = FlowClient.from_url(redis_url)
    try:
        for bad in ({}, {"max_concurrent": 0}, {"max_concurrent_per_key": True}, {"max_starts_per_s": float("nan")}):
            with pytest.raises(ConfigError):
                LimitControl(client).set("f", **bad)
    finally:
        client.close()


def test_a_per_key_limit_changes_at_run_time(h: Harness, redis_url: str) -> None:
    """``max_concurrent_per_key`` raised to 2: the busy key's parked start is given a slot by the
    set call; the flow's own ``max_concurrent`` record is not what per-key slots read."""
    client = FlowClient.from_url(redis_url, queue_name=h.store.ks.queue)
    try:
        assert hold(h, "charge", "holder", key="z") == TAKEN
        assert h.run(start("z2", "charge", customer_id="z"), message_id="5001-0") is None
        LimitControl(client).set("charge", max_concurrent=5)
        assert hold(h, "charge", "other", key="z") == FULL
        LimitControl(client).set("charge", max_concurrent_per_key=2)
        assert [b["execution_id"] for b in promoted(h)] == ["z2"]
        assert h.run(promoted(h)[-1])["status"] == "suspended"  # type: ignore[index]
        assert hold(h, "charge", "other", key="z") == TAKEN
    finally:
        client.close()


def test_a_resume_waits_for_its_key_read_from_the_execution(h: Harness) -> None:
    """A resume carries no params: its key comes from the execution's. Busy, it is handed back
    (NotForThisWorker); another key's resume runs."""
    assert h.run(start("r1", "charge", customer_id="busy"))["status"] == "suspended"  # type: ignore[index]
    assert h.run(start("r2", "charge", customer_id="free"))["status"] == "suspended"  # type: ignore[index]
    assert hold(h, "charge", "holder", key="busy") == TAKEN
    with pytest.raises(NotForThisWorker, match="every slot"):
        h.run(resume("r1"))
    assert h.run(resume("r2"))["status"] == "completed"  # type: ignore[index]
    assert limits(h).release("charge", "holder", "tok", max_concurrent=1, ttl_s=30.0, key="busy")
    assert h.run(resume("r1"))["status"] == "completed"  # type: ignore[index]


def test_a_cancelled_start_parked_behind_its_key_ends_cancelled(h: Harness) -> None:
    """The cancel finds a start parked behind a busy key (its body is in the flow's parked
    bodies) and puts it back on its stream; read, it leaves its key's parked starts and ends
    ``cancelled`` without a slot."""
    assert hold(h, "charge", "holder", key="k") == TAKEN
    h.flows.start("charge", {"customer_id": "k"}, execution_id="c1")
    [body] = [json.loads(f[b"payload"]) for _, f in h.client.xrange(h.queue.stream)]  # type: ignore[union-attr]
    assert (h.run(body) or {}).get("status") == "queued"  # parked
    assert limits(h).waiting("charge") == 1
    h.flows.cancel("c1")
    doc = h.run(body)
    assert doc is not None and doc["status"] == "cancelled" and doc["history"] == [], doc
    assert limits(h).waiting("charge") == 0
    assert h.client.zcard(flow_keys(h.store.ks, "charge", "k").parked) == 0


def test_a_key_slot_is_renewed_with_its_key(h: Harness) -> None:
    """The renewal of a key's slot extends that key's entry (the worker's renewer passes the key):
    a 500 ms slot renewed for 30 s is still held, and a slot of another key is not renewed."""
    assert hold(h, "charge", "m", key="r:1", ttl_s=0.5) == TAKEN
    assert limits(h).renew([("charge", "m", "tok", "r:1"), ("charge", "m", "tok", "r:2")], 30.0) == [True, False]
    now_s, micros = h.client.time()
    score = h.client.zscore(flow_keys(h.store.ks, "charge", "r:1").slots, "m")
    assert score is not None and score - (now_s * 1000 + micros // 1000) > 20_000


def test_a_cancelled_start_without_its_key_ends_cancelled(h: Harness) -> None:
    """A start with no key that is cancelled before it is read never parked: it ends cancelled
    (not dead-lettered for its missing key)."""
    h.flows.start("charge", {"other": 1}, execution_id="nk")
    [body] = [json.loads(f[b"payload"]) for _, f in h.client.xrange(h.queue.stream)]  # type: ignore[union-attr]
    h.flows.cancel("nk")
    doc = h.run(body)
    assert doc is not None and doc["status"] == "cancelled", doc
