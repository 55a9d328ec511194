"""Fleet-wide flow limits on one runner, real Redis: slots taken and given back, takeover of a
dead holder's slot, expiry, the start rate, and the Flow options' validation."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest
import redis

from plaita.errors import NotForThisWorker
from plaita.flows import Flow, StepContext
from plaita.flows.runner.limits import WAIT_MAX_S
from plaita.store.executions.execution_io import StoreIO
from plaita.store.executions.flow_limits import FULL, RATE_LIMITED, TAKEN, limit_keys
from tests.flows.limitdefs import suspend_once
from tests.flows.support import Harness, harness, limits, start
from tests.support.lease_workers import wait_for

pytestmark = pytest.mark.redis

gate = Flow("gate", max_concurrent=1)
gate.step(name="wait_here")(suspend_once)


@gate.step
def done(ctx: StepContext) -> str:
    return "done"


rare = Flow("rare", max_starts_per_s=0.01)  # one start, then none for 100 s
rare.step(name="pause")(suspend_once)


both = Flow("both", max_concurrent=5, max_starts_per_s=0.01)  # a slot, and one start per 100 s
both.step(name="hold")(suspend_once)


@both.step
def finish(ctx: StepContext) -> str:
    return "done"


@pytest.fixture
def h(redis_url: str) -> Iterator[Harness]:
    with harness(redis_url, flows=[gate, rare, both], slot_ttl_s=30.0) as opened:
        yield opened


def take(h: Harness, flow_id: str, eid: str, token: str, ttl_s: float = 30.0) -> int:
    return limits(h).acquire(flow_id, eid, token, max_concurrent=1, ttl_s=ttl_s, starts_per_s=0, burst=1).code


def test_a_suspended_execution_holds_no_slot(h: Harness) -> None:
    """Two executions of a one-slot flow both reach their suspension: each gave the slot back."""
    assert h.run(start("g1", "gate"))["status"] == "suspended"  # type: ignore[index]
    assert h.run(start("g2", "gate"))["status"] == "suspended"  # type: ignore[index]
    assert limits(h).holders("gate") == 0
    assert h.run({"type": "resume", "execution_id": "g1", "resume_type": "event"})["status"] == "completed"  # type: ignore[index]
    assert limits(h).holders("gate") == 0


def test_a_full_flow_parks_the_start_before_creating_anything(h: Harness) -> None:
    """Over the limit a start parks (issue 31 item 4; it was handed back to be re-read): its task
    ends, nothing is written but the parked entry, and a redelivery of it parks no second one.
    The release that frees the slot puts it back on its stream, and it takes the reserved slot."""
    assert take(h, "gate", "elsewhere", "other-worker") == TAKEN
    assert take(h, "gate", "another", "third-worker") == FULL
    for _ in range(3):
        assert h.run(start("g3", "gate")) is None
    assert h.store.get("g3") is None
    assert limits(h).waiting("gate") == 1
    assert limits(h).release("gate", "elsewhere", "other-worker", max_concurrent=1, ttl_s=30.0)
    [(_, fields)] = h.client.xrange(h.store.ks.stream(0))  # type: ignore[misc]
    assert json.loads(fields[b"payload"])["execution_id"] == "g3"
    assert take(h, "gate", "another", "third-worker") == FULL, "the freed slot is g3's"
    assert h.run(start("g3", "gate"))["status"] == "suspended"  # type: ignore[index]
    assert limits(h).waiting("gate") == 0


def test_a_resume_waits_for_a_slot_too(h: Harness) -> None:
    assert h.run(start("g4", "gate"))["status"] == "suspended"  # type: ignore[index]
    assert take(h, "gate", "elsewhere", "other-worker") == TAKEN
    resume = {"type": "resume", "execution_id": "g4", "resume_type": "event", "resume_id": "r1"}
    with pytest.raises(NotForThisWorker):
        h.run(resume)
    assert h.store.get("g4")["status"] == "suspended"  # type: ignore[index]
    limits(h).release("gate", "elsewhere", "other-worker")
    assert h.run(resume)["status"] == "completed"  # type: ignore[index]


def test_a_dead_holders_slot_of_the_same_execution_is_taken_over(h: Harness) -> None:
    """The execution's next task holds its lease: its own stale slot is no obstacle, and the
    dead holder's token can no longer give back the slot the new task took."""
    assert take(h, "gate", "g5", "dead-worker") == TAKEN
    assert h.run(start("g5", "gate"))["status"] == "suspended"  # type: ignore[index]
    assert limits(h).holders("gate") == 0
    assert take(h, "gate", "g6", "live") == TAKEN
    assert not limits(h).release("gate", "g6", "dead-worker")
    assert limits(h).holders("gate") == 1


def test_the_same_id_in_another_tenant_is_another_execution_for_the_slots(h: Harness) -> None:
    """Slots are fleet-wide, named per tenant: a slot held for tenant t1's ``g7`` is not the
    default tenant's ``g7`` (no takeover), so that start waits."""
    from plaita.flows.runner.limits import slot_member
    from plaita.tasks import Task

    member = slot_member(Task("1-0", {**start("g7", "gate"), "tenant_id": "t1"}, 1))
    assert member != "g7"
    assert take(h, "gate", member, "t1-worker") == TAKEN
    assert h.run(start("g7", "gate")) is None  # parked
    assert h.store.get("g7") is None
    assert limits(h).release("gate", member, "t1-worker")
    assert h.run(start("g7", "gate"))["status"] == "suspended"  # type: ignore[index]
    odd = slot_member(Task("2-0", start("t1\x1fg7", "gate"), 1))  # a default id that looks like one
    assert odd != member


def test_an_expired_slot_comes_back(h: Harness, rclient: redis.Redis) -> None:
    """A holder that stopped renewing (killed) leaves a slot whose expiry has passed: the next
    acquire prunes it (and its owner entry) and takes the slot."""
    assert take(h, "gate", "crashed", "gone") == TAKEN
    slots, owners, _ = limit_keys(h.store.ks, "gate")
    rclient.zadd(slots, {"crashed": 1})  # its expiry long past, as if not renewed since 1970
    assert limits(h).holders("gate") == 0
    assert h.run(start("g7", "gate"))["status"] == "suspended"  # type: ignore[index]
    assert rclient.hget(owners, "crashed") is None


def test_a_short_lived_slot_expires_on_its_own(h: Harness) -> None:
    assert take(h, "gate", "crashed", "gone", ttl_s=0.2) == TAKEN
    wait_for(lambda: limits(h).holders("gate") == 0, 10, "the crashed holder's slot to expire")
    assert take(h, "gate", "next", "t") == TAKEN


def test_the_start_rate_counts_starts_only(h: Harness) -> None:
    assert h.run(start("r1", "rare"))["status"] == "suspended"  # type: ignore[index]
    with pytest.raises(NotForThisWorker) as caught:
        h.run(start("r2", "rare"))
    assert 0 < caught.value.delay_s <= WAIT_MAX_S and h.store.get("r2") is None
    reply = limits(h).acquire("rare", "r3", "t", max_concurrent=0, ttl_s=30, starts_per_s=0.01, burst=1)
    assert reply.code == RATE_LIMITED and reply.wait_s > 50  # about 100 s until the next token
    done = h.run({"type": "resume", "execution_id": "r1", "resume_type": "event"})
    assert done is not None and done["status"] == "completed"


def test_a_key_of_another_type_is_refused_before_any_write(h: Harness, rclient: redis.Redis) -> None:
    slots, owners, _ = limit_keys(h.store.ks, "gate")
    rclient.set(owners, "not a hash")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        take(h, "gate", "x", "t")
    assert rclient.exists(slots) == 0


def server_ms(client: redis.Redis) -> int:
    now_s, micros = client.time()
    return int(now_s) * 1000 + int(micros) // 1000


def test_the_start_bucket_holds_at_most_its_burst_after_a_quiet_spell(h: Harness, rclient: redis.Redis) -> None:
    """Guards issue 31: tokens accrue while a flow is idle only up to its burst. The bug put in
    by hand (the refill not capped, ``math.min(burst, …)`` dropped from acquire_flow_slot)
    let 20 starts through at once after 20 s idle at 1/s with a burst of 1. The quiet spell is
    written into the bucket (its last refill 20 s ago, server time) instead of waited out."""
    store = limits(h)

    def start_token(eid: str) -> int:
        return store.acquire("rated", eid, "t", max_concurrent=0, ttl_s=30, starts_per_s=1.0, burst=1.0).code

    assert start_token("s0") == TAKEN  # the bucket exists, its one token spent
    _, _, bucket = limit_keys(h.store.ks, "rated")
    rclient.hset(bucket, "at_ms", server_ms(rclient) - 20_000)  # idle for 20 s since
    codes = [start_token(f"s{i}") for i in range(1, 21)]
    assert codes.count(TAKEN) == 1 and codes[0] == TAKEN, codes
    assert set(codes[1:]) == {RATE_LIMITED}


def test_a_resume_never_takes_a_start_token(h: Harness, rclient: redis.Redis) -> None:
    """Guards issue 31: only starts are rate limited (docs/flows.md, Fleet-wide limits). A flow
    with both limits checks a resume for its slot, and must not charge it a start token. The
    bugs put in by hand (a resume entering with ``start=True``, or ``FlowLimits.enter`` asking
    the rate of any task) refused this resume for 100 s, the one token being the start's."""
    assert h.run(start("b1", "both"))["status"] == "suspended"  # type: ignore[index]
    _, _, bucket = limit_keys(h.store.ks, "both")
    before = rclient.hgetall(bucket)
    assert float(before["tokens"]) < 1  # the start took the only token
    done = h.run({"type": "resume", "execution_id": "b1", "resume_type": "event"})
    assert done is not None and done["status"] == "completed"
    assert rclient.hgetall(bucket) == before  # the resume left the bucket alone
    assert limits(h).holders("both") == 0


@pytest.mark.parametrize("loss", ["taken_over", "expired"])
def test_a_holder_that_lost_its_slot_fails_to_renew_it_and_says_so(
    h: Harness, rclient: redis.Redis, caplog: pytest.LogCaptureFixture, loss: str
) -> None:
    """Guards issue 31: a renewal is compare-and-extend. A holder whose slot was taken over (the
    execution's next task took it with its own token) or expired (its worker was cut off past
    the ttl) must fail to renew, stop renewing and log it. The bugs put in by hand (the token
    check or the expiry check dropped from renew_flow_slots, or the failure not reported by
    ``renew_once``) renewed a slot someone else holds, or lost it without a word."""
    from plaita.flows.runner.limits import FlowLimits, slot_member
    from plaita.tasks import Task

    fl = FlowLimits(limits(h), ttl_s=30.0)
    task = Task("1-0", start("lost1", "gate"), 1)
    member = slot_member(task)
    slots, owners, _ = limit_keys(h.store.ks, "gate")
    try:
        asyncio.run(fl.enter(StoreIO(h.store, here=True), gate, task, start=True))
        assert fl.holds(task)
        fl.renew_once()
        assert fl.holds(task)  # renewing a slot it holds works
        if loss == "taken_over":
            assert take(h, "gate", member, "next-task") == TAKEN
        else:
            rclient.zadd(slots, {member: server_ms(rclient) - 1000})  # past its expiry, not pruned yet
        score = rclient.zscore(slots, member)
        with caplog.at_level("WARNING", logger="plaita.flows.runner.limits"):
            fl.renew_once()
        assert not fl.holds(task)
        assert any("lost1" in r.getMessage() and "expired" in r.getMessage() for r in caplog.records), caplog.text
        assert rclient.zscore(slots, member) == score  # not extended by the holder that lost it
        if loss == "taken_over":
            assert rclient.hget(owners, member) == "next-task"
    finally:
        fl.close()
