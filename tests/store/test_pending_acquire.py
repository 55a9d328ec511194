"""An acquire sent without waiting (``LeaseManager.send_acquire_many``), on real Redis: the same
leases as the blocking call, NOSCRIPT handled, and its connection given back exactly once
whether the reply is read, abandoned or lost, so no later command ever reads a stale reply."""

from __future__ import annotations

import pytest
import redis

from plaita.store.client import interrupt
from plaita.store.keyspace import DEFAULT, Keyspace
from plaita.store.leases import FENCE_TTL_S, Lease, LeaseManager

pytestmark = pytest.mark.redis


def in_use(bclient: redis.Redis) -> int:
    return len(bclient.connection_pool._in_use_connections)  # type: ignore[attr-defined]


def test_the_reply_read_later_holds_the_same_leases_as_the_blocking_call(bclient: redis.Redis) -> None:
    leases = LeaseManager(bclient, consumer="c1", ttl_s=30)
    other = LeaseManager(bclient, consumer="c2", ttl_s=30)
    held = other.acquire("taken")
    assert isinstance(held, Lease)
    pending = leases.send_acquire_many(["e1", "taken", "e2", "e1"])
    assert in_use(bclient) == 1  # the acquire's own connection, until its reply is read
    assert bclient.get("unrelated") is None  # another command meanwhile gets its own reply
    e1, taken, e2, again = pending.result()
    assert in_use(bclient) == 0
    assert e1 == Lease("e1", DEFAULT.lease_key("e1"), f"{leases.holder}:1", 1)
    assert isinstance(e2, Lease) and e2.generation == 1
    assert taken == held.value and again == e1.value  # refused: another holder; ours in this batch
    assert bclient.get(DEFAULT.lease_key("e1")) == e1.value.encode()
    assert 0 < int(bclient.ttl(DEFAULT.fence_key("e1"))) <= FENCE_TTL_S
    assert leases.send_acquire_many(["e1"]).result() == [e1.value]  # held by us now: refused


def test_a_server_without_the_script_acquires_the_batch_once(bclient: redis.Redis) -> None:
    leases = LeaseManager(bclient, consumer="c1", ttl_s=30)
    bclient.script_flush()
    (got,) = leases.send_acquire_many(["e1"]).result()
    assert isinstance(got, Lease) and got.generation == 1  # NOSCRIPT ran nothing: one acquire
    assert int(bclient.get(DEFAULT.fence_key("e1")) or 0) == 1
    assert in_use(bclient) == 0


def test_an_abandoned_reply_is_never_read_by_a_later_command(bclient: redis.Redis) -> None:
    leases = LeaseManager(bclient, consumer="c1", ttl_s=30)
    pending = leases.send_acquire_many(["e1", "e2"])
    pending.abandon()
    assert in_use(bclient) == 0
    # Every pooled connection answers its own command, not the abandoned acquire's reply.
    for i in range(4):
        bclient.set(f"k{i}", i)
        assert bclient.get(f"k{i}") == str(i).encode()
    pending.abandon()  # a second time: nothing left to give back
    with pytest.raises(RuntimeError):
        pending.result()


def test_a_reply_cut_by_a_stop_raises_and_gives_the_connection_back_closed(bclient: redis.Redis) -> None:
    leases = LeaseManager(bclient, consumer="c1", ttl_s=30)
    bclient.client_pause(2000, all=False)  # scripts wait (bounded): the reply cannot be out before the cut
    try:
        pending = leases.send_acquire_many(["e1"])
        interrupt(bclient)  # what a stop does to the owner's calls in progress
        with pytest.raises(redis.exceptions.ConnectionError):
            pending.result()
        assert in_use(bclient) == 0
    finally:
        bclient.client_unpause()
    # The script may have run (only its reply was lost): then the lease is ours, and a retry says so.
    again = leases.acquire("e1")
    assert isinstance(again, Lease) or leases.ours("e1", again) is not None
    assert bclient.get("unrelated") is None  # the pool's connections are sound


def test_partitions_fall_back_to_the_blocking_call(bclient: redis.Redis) -> None:
    leases = LeaseManager(bclient, consumer="c1", ttl_s=30, keyspace=Keyspace("q", 2, tagged=True))
    pending = leases.send_acquire_many(["e1", "e2"])
    assert in_use(bclient) == 0  # one script call per partition, already answered
    assert all(isinstance(g, Lease) for g in pending.result())
