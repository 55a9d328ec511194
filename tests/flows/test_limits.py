"""Fleet-wide flow limits on one runner, real Redis: slots taken and given back, takeover of a
dead holder's slot, expiry, the start rate, and the Flow options' validation."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from plaita.errors import ConfigError, NotForThisWorker
from plaita.flows import Flow, StepContext
from plaita.flows.limits import WAIT_MAX_S
from plaita.store.flow_limits import FULL, RATE_LIMITED, TAKEN, FlowLimitStore, limit_keys
from plaita.store.keyspace import DEFAULT, Keyspace, hash_tag
from tests.flows.support import Harness, start
from tests.support.lease_workers import wait_for

pytestmark = pytest.mark.redis

gate = Flow("gate", max_concurrent=1)


@gate.step
def wait_here(ctx: StepContext) -> Any:
    return ctx.suspend() if ctx.resume is None else None


@gate.step
def done(ctx: StepContext) -> str:
    return "done"


rare = Flow("rare", max_starts_per_s=0.01)  # one start, then none for 100 s


@rare.step
def pause(ctx: StepContext) -> Any:
    return ctx.suspend() if ctx.resume is None else None


@pytest.fixture
def h(redis_url: str) -> Any:
    harness = Harness(redis_url, flows=[gate, rare], slot_ttl_s=30.0)
    yield harness
    harness.close()


def limits(h: Harness) -> FlowLimitStore:
    return FlowLimitStore(h.client, h.store.ks)


def take(h: Harness, flow_id: str, eid: str, token: str, ttl_s: float = 30.0) -> int:
    return limits(h).acquire(flow_id, eid, token, max_concurrent=1, ttl_s=ttl_s, starts_per_s=0, burst=1).code


def test_a_suspended_execution_holds_no_slot(h: Harness) -> None:
    """Two executions of a one-slot flow both reach their suspension: each gave the slot back."""
    assert h.run(start("g1", "gate"))["status"] == "suspended"  # type: ignore[index]
    assert h.run(start("g2", "gate"))["status"] == "suspended"  # type: ignore[index]
    assert limits(h).holders("gate") == 0
    assert h.run({"type": "resume", "execution_id": "g1", "resume_type": "event"})["status"] == "completed"  # type: ignore[index]
    assert limits(h).holders("gate") == 0


def test_a_full_flow_hands_the_start_back_before_creating_anything(h: Harness) -> None:
    """Over the limit a start raises a delayed hand-back (no DLQ, no delivery) and writes nothing."""
    assert take(h, "gate", "elsewhere", "other-worker") == TAKEN
    assert take(h, "gate", "another", "third-worker") == FULL
    delays = []
    for _ in range(8):
        with pytest.raises(NotForThisWorker) as caught:
            h.run(start("g3", "gate"))
        assert caught.value.hand_back
        delays.append(caught.value.delay_s)
    assert h.store.get("g3") is None
    assert all(0 < d <= WAIT_MAX_S for d in delays)
    assert delays[-1] > delays[0]  # the wait grows while the flow stays full
    assert limits(h).release("gate", "elsewhere", "other-worker")
    assert h.run(start("g3", "gate"))["status"] == "suspended"  # type: ignore[index]


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
    from plaita.flows.limits import slot_member
    from plaita.tasks import Task

    member = slot_member(Task("1-0", {**start("g7", "gate"), "tenant_id": "t1"}, 1))
    assert member != "g7"
    assert take(h, "gate", member, "t1-worker") == TAKEN
    with pytest.raises(NotForThisWorker):
        h.run(start("g7", "gate"))
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


def test_limit_keys_share_one_hash_tag_of_their_own() -> None:
    """Every script touches keys of one slot (Redis Cluster), apart from the partitions' tags."""
    for ks in (DEFAULT, Keyspace("q", partitions=4, tagged=True)):
        keys = limit_keys(ks, "my}flow")
        assert len({hash_tag(k) for k in keys}) == 1
        assert hash_tag(keys[0]) not in ks.tags


def test_a_key_of_another_type_is_refused_before_any_write(h: Harness, rclient: redis.Redis) -> None:
    slots, owners, _ = limit_keys(h.store.ks, "gate")
    rclient.set(owners, "not a hash")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        take(h, "gate", "x", "t")
    assert rclient.exists(slots) == 0


@pytest.mark.parametrize(
    "options",
    [{"max_concurrent": 0}, {"max_concurrent": True}, {"max_concurrent": 1.5}, {"max_starts_per_s": 0},
     {"max_starts_per_s": float("nan")}, {"max_starts_per_s": "5"}],
)  # fmt: skip
def test_bad_limits_are_config_errors(options: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match="max_"):
        Flow("f", **options)
