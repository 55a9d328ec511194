"""A checkpoint (and a create) is all or nothing: every refusal, at every write position, leaves
every key it would have touched exactly as it was. Real Redis, real leases, the store's own calls."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import redis

from plaita.store.executions.execution_io import checkpoint_now, create_now
from plaita.store.executions.store import (
    FLAG_TTL_S,
    STATUSES,
    ExecutionKeyError,
    ExecutionStore,
    Staged,
    StagedWriteRefused,
)
from plaita.store.keyspace import DEADLINES_KEY, DEFAULT
from plaita.store.leases import Lease, LeaseManager
from tests.support.redis_server import over_maxmemory

pytestmark = pytest.mark.redis

MAX = 2**63 - 1
MIN = -(2**63)
GOOD = [Staged("incrby", "app:good1", "1"), Staged("set", "app:good2", "v", 60), Staged("rpush", "app:good3", "x")]


def read_key(client: redis.Redis, key: str) -> tuple[Any, ...]:
    """Everything observable about ``key``: type, value and whether it has a TTL."""
    kind = client.type(key).decode()  # type: ignore[union-attr]
    readers = {
        "string": lambda: client.get(key),
        "list": lambda: client.lrange(key, 0, -1),
        "hash": lambda: client.hgetall(key),
        "zset": lambda: client.zrange(key, 0, -1, withscores=True),
        "set": lambda: sorted(client.smembers(key)),  # type: ignore[arg-type]
    }
    value = readers[kind]() if kind in readers else None
    return kind, value, int(client.pttl(key)) > 0  # type: ignore[arg-type]


def watched(eid: str, extra: list[str]) -> list[str]:
    return [
        DEFAULT.execution_key(eid),
        DEFAULT.cancel_key(eid),
        DEADLINES_KEY,
        *(DEFAULT.status_key(0, s) for s in STATUSES),
        *(s.key for s in GOOD),
        *extra,
    ]


def snapshot(client: redis.Redis, keys: list[str]) -> dict[str, tuple[Any, ...]]:
    return {k: read_key(client, k) for k in keys}


class Setup:
    """A created execution ``eid`` under a held lease, state ``{"n": 0}``, running."""

    def __init__(self, client: redis.Redis, eid: str) -> None:
        self.client, self.eid = client, eid
        self.store = ExecutionStore(client)
        self.leases = LeaseManager(client, consumer=f"atomic-{eid}", ttl_s=30.0)
        lease = self.leases.acquire(eid)
        assert isinstance(lease, Lease)
        self.lease = lease
        code, _, _ = create_now(self.store, eid, lease.generation, json.dumps({"n": 0}), time.time(), None)
        assert code == 1

    def checkpoint(self, staged: list[Staged], *, status: str = "completed", generation: int | None = None) -> bool:
        gen = self.lease.generation if generation is None else generation
        ok, _ = checkpoint_now(
            self.store,
            self.eid,
            gen,
            json.dumps({"n": 1}),
            status=status,
            now_s=time.time(),
            deadline_s=time.time() + 60 if status == "suspended" else None,
            retention_s=3600,
            staged=staged,
        )
        return ok


def test_control_the_same_checkpoint_without_its_bad_write_lands_whole(client: redis.Redis) -> None:
    s = Setup(client, "ok1")
    assert s.checkpoint(GOOD)
    assert json.loads(client.get(DEFAULT.execution_key("ok1"))) == {"n": 1}  # type: ignore[arg-type]
    assert client.get("app:good1") == b"1" and client.get("app:good2") == b"v"
    assert 0 < int(client.ttl("app:good2")) <= 60  # type: ignore[arg-type]
    assert client.lrange("app:good3", 0, -1) == [b"x"]
    assert client.zscore(DEFAULT.status_key(0, "completed"), "ok1") is not None


# (setup of the bad key in Redis, the bad staged write, what the refusal must name)
LUA_REFUSALS = {
    "incrby-on-list": (("rpush", "app:bad", "a"), Staged("incrby", "app:bad", "1"), "list"),
    "incrby-on-hash": (("hset", "app:bad", "f", "v"), Staged("incrby", "app:bad", "1"), "hash"),
    "incrby-on-text": (("set", "app:bad", "abc"), Staged("incrby", "app:bad", "1"), "not an integer"),
    "incrby-on-padded-int": (("set", "app:bad", "07"), Staged("incrby", "app:bad", "1"), "not an integer"),
    "incrby-overflow": (("set", "app:bad", str(MAX)), Staged("incrby", "app:bad", "1"), "overflow"),
    "incrby-underflow": (("set", "app:bad", str(MIN)), Staged("incrby", "app:bad", "-1"), "overflow"),
    "rpush-on-string": (("set", "app:bad", "abc"), Staged("rpush", "app:bad", "x"), "string"),
    "rpush-on-zset": (("zadd", "app:bad", {"m": 1}), Staged("rpush", "app:bad", "x"), "zset"),
    "rpush-with-ttl-on-set": (("sadd", "app:bad", "m"), Staged("rpush", "app:bad", "x", 30), "set"),
}
# Bad values the store refuses before calling Redis (the script would fail after writing).
PY_REFUSALS = {
    "ttl-too-large": Staged("set", "app:bad", "v", 10**19),
    "ttl-negative": Staged("set", "app:bad", "v", -1),
    "incrby-amount-too-large": Staged("incrby", "app:bad", str(10**30)),
    "incrby-amount-not-integer": Staged("incrby", "app:bad", "1.5"),
    "unknown-op": Staged("lpush", "app:bad", "x"),
}
POSITIONS = {"first": 0, "middle": 1, "last": len(GOOD)}


def _with_bad(bad: Staged, position: str) -> list[Staged]:
    writes = list(GOOD)
    writes.insert(POSITIONS[position], bad)
    return writes


@pytest.mark.parametrize("position", list(POSITIONS))
@pytest.mark.parametrize("case", list(LUA_REFUSALS))
def test_a_staged_write_redis_would_refuse_writes_nothing(client: redis.Redis, case: str, position: str) -> None:
    (command, *args), bad, named = LUA_REFUSALS[case]
    s = Setup(client, "a1")
    getattr(client, command)(*args)
    keys = watched("a1", ["app:bad"])
    before = snapshot(client, keys)
    with pytest.raises(StagedWriteRefused, match=named) as caught:
        s.checkpoint(_with_bad(bad, position))
    assert caught.value.key == "app:bad"
    assert snapshot(client, keys) == before


@pytest.mark.parametrize("position", list(POSITIONS))
@pytest.mark.parametrize("case", list(PY_REFUSALS))
def test_a_bad_staged_value_writes_nothing(client: redis.Redis, case: str, position: str) -> None:
    s = Setup(client, "p1")
    keys = watched("p1", ["app:bad"])
    before = snapshot(client, keys)
    with pytest.raises(StagedWriteRefused) as caught:
        s.checkpoint(_with_bad(PY_REFUSALS[case], position))
    assert caught.value.key == "app:bad"
    assert snapshot(client, keys) == before


# Writes of one checkpoint that only fail because of an earlier write of the same checkpoint.
CHAINS = {
    "set-text-then-incrby": [Staged("set", "app:bad", "abc"), Staged("incrby", "app:bad", "1")],
    "set-max-then-incrby": [Staged("set", "app:bad", str(MAX)), Staged("incrby", "app:bad", "1")],
    "rpush-then-incrby": [Staged("rpush", "app:bad", "x"), Staged("incrby", "app:bad", "1")],
    "incrby-then-rpush": [Staged("incrby", "app:bad", "1"), Staged("rpush", "app:bad", "x")],
    "set-then-rpush": [Staged("set", "app:bad", "v"), Staged("rpush", "app:bad", "x")],
    "increments-overflow-together": [Staged("incrby", "app:bad", str(MAX)), Staged("incrby", "app:bad", str(MAX))],
}


@pytest.mark.parametrize("case", list(CHAINS))
def test_a_write_refused_because_of_an_earlier_one_writes_nothing(client: redis.Redis, case: str) -> None:
    s = Setup(client, "c1")
    keys = watched("c1", ["app:bad"])
    before = snapshot(client, keys)
    with pytest.raises(StagedWriteRefused, match="app:bad"):
        s.checkpoint([GOOD[0], *CHAINS[case], GOOD[1]])
    assert snapshot(client, keys) == before


def test_an_incrby_chain_within_range_of_the_current_value_lands(client: redis.Redis) -> None:
    s = Setup(client, "c2")
    client.set("app:n", str(MAX - 5))
    chain = [Staged("incrby", "app:n", "-10"), Staged("incrby", "app:n", "15"), Staged("incrby", "app:n", "-3")]
    assert s.checkpoint(chain)
    assert int(client.get("app:n")) == MAX - 3  # type: ignore[arg-type]
    s2 = Setup(client, "c3")
    with pytest.raises(StagedWriteRefused, match="overflow"):  # MAX - 3 - 10 + 15 > MAX on the way
        s2.checkpoint(chain)
    assert int(client.get("app:n")) == MAX - 3  # type: ignore[arg-type]


@pytest.mark.parametrize("status", STATUSES)
@pytest.mark.parametrize("index", [DEADLINES_KEY, *(DEFAULT.status_key(0, s) for s in STATUSES)])
def test_a_wrong_typed_index_key_refuses_the_checkpoint_that_adds_to_it(
    client: redis.Redis, index: str, status: str
) -> None:
    """The index the checkpoint adds to must be a sorted set (else nothing is written); one it
    only removes the execution from holds no member, so the checkpoint lands whole."""
    s = Setup(client, "i1")
    client.delete(index)
    client.set(index, "not a sorted set")
    keys = watched("i1", [])
    before = snapshot(client, keys)
    adds = index == DEFAULT.status_key(0, status) or (index == DEADLINES_KEY and status == "suspended")
    if not adds:
        assert s.checkpoint(GOOD, status=status)
        assert json.loads(client.get(DEFAULT.execution_key("i1"))) == {"n": 1}  # type: ignore[arg-type]
        assert client.get("app:good1") == b"1" and client.get(index) == b"not a sorted set"
        return
    with pytest.raises(ExecutionKeyError, match="not a sorted set") as caught:
        s.checkpoint(GOOD, status=status)
    assert caught.value.key == index
    assert snapshot(client, keys) == before


def _stale_lease(s: Setup) -> None:
    s.leases.release(s.lease)  # the same holder takes it again: generation + 1
    again = s.leases.acquire(s.eid)
    assert isinstance(again, Lease) and again.generation == s.lease.generation + 1


FENCED_OUT = {
    # Only the fence counter moved on (the lease value still ends in our generation).
    "fence-advanced": lambda s: s.client.incr(DEFAULT.fence_key(s.eid)),
    # Only the lease moved on: another holder's value, the fence counter untouched.
    "lease-taken": lambda s: s.client.set(
        DEFAULT.lease_key(s.eid), f"worker:other@x:{s.lease.generation + 1}", px=30_000
    ),
    "lease-expired": lambda s: s.client.delete(DEFAULT.lease_key(s.eid)),
    "same-holder-reacquired": _stale_lease,
    "lease-wrong-type": lambda s: (
        s.client.delete(DEFAULT.lease_key(s.eid)),
        s.client.rpush(DEFAULT.lease_key(s.eid), "x"),
    ),
}


@pytest.mark.parametrize("case", list(FENCED_OUT))
@pytest.mark.parametrize("with_staged", [False, True])
def test_a_fenced_out_checkpoint_writes_neither_state_nor_staged_keys(
    client: redis.Redis, case: str, with_staged: bool
) -> None:
    s = Setup(client, "f1")
    client.set(DEFAULT.cancel_key("f1"), "1")  # a terminal checkpoint would delete it
    FENCED_OUT[case](s)
    keys = watched("f1", [])
    before = snapshot(client, keys)
    assert s.checkpoint(GOOD if with_staged else [], status="completed") is False
    assert snapshot(client, keys) == before
    assert json.loads(client.get(DEFAULT.execution_key("f1"))) == {"n": 0}  # type: ignore[arg-type]


# -- the create script ---------------------------------------------------------------------
def _create(client: redis.Redis, eid: str, dedup: str | None) -> int:
    store, leases = ExecutionStore(client), LeaseManager(client, consumer=f"create-{eid}", ttl_s=30.0)
    lease = leases.acquire(eid)
    assert isinstance(lease, Lease)
    return create_now(store, eid, lease.generation, json.dumps({"n": 0}), time.time(), dedup)[0]


def test_create_records_the_dedup_key_with_its_ttl(client: redis.Redis) -> None:
    assert _create(client, "d1", "order-1") == 1
    assert client.get(DEFAULT.dedup_key(0, "order-1")) == b"d1"
    ttl_s = int(client.ttl(DEFAULT.dedup_key(0, "order-1")))  # type: ignore[arg-type]
    assert FLAG_TTL_S - 60 < ttl_s <= FLAG_TTL_S


CREATE_KEYS = {
    "state": DEFAULT.execution_key("k1"),
    "running-index": DEFAULT.status_key(0, "running"),
    "queued-index": DEFAULT.status_key(0, "queued"),
    "error-index": DEFAULT.status_key(0, "error"),
    "dedup": DEFAULT.dedup_key(0, "order-2"),
}


def _assert_create_refused_naming(client: redis.Redis, key: str) -> None:
    """A create of ``k1`` (dedup ``order-2``) refused with ExecutionKeyError naming ``key``,
    every key it would touch left as it was."""
    keys = list(CREATE_KEYS.values())
    before = snapshot(client, keys)
    with pytest.raises(ExecutionKeyError, match="wrong type") as caught:
        _create(client, "k1", "order-2")
    assert caught.value.key == key
    assert snapshot(client, keys) == before


@pytest.mark.parametrize("target", list(CREATE_KEYS))
def test_create_with_a_wrong_typed_key_writes_nothing(client: redis.Redis, target: str) -> None:
    key = CREATE_KEYS[target]
    client.hset(key, "f", "v")
    _assert_create_refused_naming(client, key)


@pytest.mark.parametrize("other", ["existing-state", "dedup-taken", "queued-index-wrong"])
def test_a_wrong_typed_running_index_is_named_before_any_later_refusal(client: redis.Redis, other: str) -> None:
    """The keys are checked in order: a wrong-typed running index is the reply even when the
    execution exists, its dedup key names another one, or a later key is wrong-typed too."""
    running = DEFAULT.status_key(0, "running")
    client.hset(running, "f", "v")
    if other == "existing-state":
        client.set(DEFAULT.execution_key("k1"), json.dumps({"status": "completed"}))
    elif other == "dedup-taken":
        client.set(DEFAULT.dedup_key(0, "order-2"), "another")
    else:
        client.hset(DEFAULT.status_key(0, "queued"), "f", "v")
    _assert_create_refused_naming(client, running)


def test_create_takes_a_queued_record_out_of_the_queued_and_error_indexes(client: redis.Redis) -> None:
    client.set(DEFAULT.execution_key("k3"), json.dumps({"status": "queued"}))
    for status in ("queued", "error"):
        client.zadd(DEFAULT.status_key(0, status), {"k3": 1.5, "other": 2.5})
    assert _create(client, "k3", None) == 1
    for status in ("queued", "error"):
        assert client.zrange(DEFAULT.status_key(0, status), 0, -1) == [b"other"]
    assert client.zscore(DEFAULT.status_key(0, "running"), "k3") is not None


def test_a_fenced_out_create_writes_nothing(client: redis.Redis) -> None:
    store, leases = ExecutionStore(client), LeaseManager(client, consumer="create-x", ttl_s=30.0)
    lease = leases.acquire("k2")
    assert isinstance(lease, Lease)
    client.incr(DEFAULT.fence_key("k2"))
    keys = [DEFAULT.execution_key("k2"), DEFAULT.status_key(0, "running"), DEFAULT.dedup_key(0, "order-3")]
    before = snapshot(client, keys)
    assert create_now(store, "k2", lease.generation, "{}", time.time(), "order-3")[0] == 0
    assert snapshot(client, keys) == before


@pytest.mark.parametrize("write", ["create", "checkpoint", "running-checkpoint"])
def test_a_first_write_refused_over_maxmemory_is_the_servers_oom_not_a_wrong_typed_index(
    client: redis.Redis, write: str
) -> None:
    """Redis refuses a script's first write (the ZADD to its status index) over maxmemory: the
    caller gets that OOM error, not an ExecutionKeyError naming a sound index; nothing written."""
    s = Setup(client, "o1")
    new = s.leases.acquire("o2")
    assert isinstance(new, Lease)
    keys = [*watched("o1", []), DEFAULT.execution_key("o2")]
    before = snapshot(client, keys)
    with over_maxmemory(client), pytest.raises(redis.exceptions.OutOfMemoryError):
        if write == "create":
            create_now(s.store, "o2", new.generation, "{}", time.time(), None)
        else:
            checkpoint_now(
                s.store,
                "o1",
                s.lease.generation,
                json.dumps({"n": 1}),
                status="running",
                now_s=time.time(),
                after_running=write == "running-checkpoint",
            )
    assert snapshot(client, keys) == before
