"""Calls of one script written at once on the loop connection go out as one EVALSHA of the
script's batch twin (``plaita.store.batch_scripts``) and keep every guarantee of a call sent
alone: each gets its own reply, a stale writer or a call that fails gets its own refusal or
error while its neighbours are written, each staged write runs once (also after the server lost
its scripts: NOSCRIPT re-sends each call alone), and calls of other scripts or partitions are
not merged. Real Redis, real leases; the server's EVALSHA count shows what was merged."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import struct
import time
from typing import Any

import pytest
import redis

from plaita.store import batch_scripts, scripts
from plaita.store.batch_scripts import MAX_BATCH_CALLS, MAX_COUNT, Batch, batch_of, entries, hash_tag
from plaita.store.calls import ScriptCall
from plaita.store.executions import loop_calls
from plaita.store.executions.execution_io import checkpoint_call, create_call
from plaita.store.executions.loop_calls import LoopCalls
from plaita.store.executions.store import Staged
from plaita.store.keyspace import DEFAULT, Keyspace
from tests.support.flow_calls import answer_bytewise, created, leased, step
from tests.support.redis_server import over_maxmemory

pytestmark = pytest.mark.redis


@pytest.fixture
def client(bclient: redis.Redis) -> redis.Redis:
    return bclient


def evalsha_calls(client: redis.Redis) -> int:
    return int(client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))


def sent_at_once(client: redis.Redis, warm: ScriptCall, calls: list[ScriptCall]) -> tuple[Any, list[Any], int]:
    """``warm`` alone (the loop connection made), then ``calls`` in one write: the outcome of
    ``warm``, of each call (an exception for one that raised), and how many EVALSHA the server
    ran for ``calls``."""
    on_loop = LoopCalls()

    async def scenario() -> tuple[Any, list[Any], int]:
        warmed = await on_loop.run(warm)
        before = await asyncio.to_thread(evalsha_calls, client)
        # No await before each call is queued: one write takes them all.
        outcomes = await asyncio.gather(*(on_loop.run(c) for c in calls), return_exceptions=True)
        return warmed, outcomes, await asyncio.to_thread(evalsha_calls, client) - before

    try:
        return asyncio.run(asyncio.wait_for(scenario(), 30))
    finally:
        on_loop.stop()


def test_a_batch_of_checkpoints_gives_each_its_own_reply(client: redis.Redis) -> None:
    eids = [f"tw{i}" for i in range(8)]
    store, gens = created(client, eids)
    warm = step(store, eids[0], gens[eids[0]] - 1, 0)  # a stale writer: refused, writes nothing
    warmed, outcomes, evalshas = sent_at_once(client, warm, [step(store, e, gens[e], 1) for e in eids])
    assert warmed == (False, False)
    assert outcomes == [(True, False)] * len(eids)
    assert evalshas == 1  # one batch
    assert [store.get(e) for e in eids] == [{"n": 1}] * len(eids)
    assert [client.get(f"app:{e}") for e in eids] == [b"1"] * len(eids)


def test_a_fenced_out_call_and_a_cancelled_one_do_not_touch_their_neighbours(client: redis.Redis) -> None:
    eids = ["fo1", "fo2", "fo3", "fo4"]
    store, gens = created(client, eids)
    client.set(store.ks.cancel_key("fo3"), "1")
    calls = [step(store, e, gens[e] - (e == "fo2"), 1) for e in eids]  # fo2's writer is stale
    _, outcomes, evalshas = sent_at_once(client, step(store, "fo1", 0, 0), calls)
    assert evalshas == 1
    assert outcomes == [(True, False), (False, False), (True, True), (True, False)]
    assert [client.get(f"app:{e}") for e in eids] == [b"1", None, b"1", b"1"]
    assert store.get("fo2") == {}


def test_a_call_that_errors_gets_its_own_error_as_alone_and_the_others_are_written(client: redis.Redis) -> None:
    eids = ["er1", "er2", "er3", "er4"]
    store, gens = created(client, eids)
    client.set("app:er3", "a string")
    # er2: a staged-write count its script cannot read (a Lua runtime error); er3: an RPUSH
    # the caller's checks were told to skip (need '' instead of 'list') on a string: WRONGTYPE.
    broken = step(store, "er2", gens["er2"], 1)
    broken = dataclasses.replace(broken, args=[*broken.args[:7], "x", *broken.args[8:]])
    rpush = step(store, "er3", gens["er3"], 1)
    rpush = dataclasses.replace(rpush, args=[*rpush.args[:8], "rpush", "v", "0", ""])
    alone = []
    for call in (broken, rpush):
        with pytest.raises(redis.ResponseError) as raised:
            call.run()
        alone.append(raised.value)
    calls = [step(store, "er1", gens["er1"], 1), broken, rpush, step(store, "er4", gens["er4"], 1)]
    _, outcomes, evalshas = sent_at_once(client, step(store, "er1", 0, 0), calls)
    assert evalshas == 1
    assert outcomes[0] == (True, False) and outcomes[3] == (True, False), outcomes
    for batched, single in zip(outcomes[1:3], alone, strict=True):
        assert type(batched) is type(single), (batched, single)
    limit = "'for' limit must be a number"
    assert limit in str(outcomes[1]) and limit in str(alone[0]), (outcomes[1], alone[0])
    assert str(outcomes[2]).startswith("WRONGTYPE") and str(alone[1]).startswith("WRONGTYPE")
    assert [client.get(f"app:{e}") for e in ("er1", "er4")] == [b"1", b"1"]


def test_script_flush_recovers_each_call_applied_once_and_the_twin_loaded(client: redis.Redis) -> None:
    eids = [f"nf{i}" for i in range(6)]
    store, gens = created(client, eids)
    twin = batch_of(scripts.script("checkpoint_execution"))
    assert twin is not None
    on_loop = LoopCalls()

    async def scenario() -> tuple[list[Any], list[Any], int]:
        assert await on_loop.run(step(store, "nf0", 0, 0)) == (False, False)  # connected
        await asyncio.to_thread(client.script_flush)
        first = await asyncio.gather(*(on_loop.run(step(store, e, gens[e], 1)) for e in eids))
        before = await asyncio.to_thread(evalsha_calls, client)
        second = await asyncio.gather(*(on_loop.run(step(store, e, gens[e], 2)) for e in eids))
        return first, second, await asyncio.to_thread(evalsha_calls, client) - before

    try:
        first, second, evalshas = asyncio.run(asyncio.wait_for(scenario(), 30))
    finally:
        on_loop.stop()
    assert first == second == [(True, False)] * len(eids)
    assert [client.get(f"app:{e}") for e in eids] == [b"2"] * len(eids)  # each applied once per step
    assert client.script_exists(twin.sha) == [True]
    assert evalshas == 1  # the twin is back: the next write is one batch again


def test_calls_of_different_scripts_are_not_merged(client: redis.Redis) -> None:
    eids = ["ds1", "ds2", "ds3", "ds4"]
    store, gens = created(client, eids[:2])
    new = leased(client, eids[2:])
    calls = [
        step(store, "ds1", gens["ds1"], 1),
        step(store, "ds2", gens["ds2"], 1, running=True),
        create_call(client, store.ks, "ds3", new["ds3"], "{}", time.time(), None),
        step(store, "ds1", gens["ds1"] - 1, 1),  # stale: refused, merged with the first
        create_call(client, store.ks, "ds4", new["ds4"], "{}", time.time(), None),
    ]
    _, outcomes, evalshas = sent_at_once(client, step(store, "ds2", 0, 0, running=True), calls)
    assert evalshas == 3
    assert outcomes == [(True, False), (True, False), (1, "", False), (False, False), (1, "", False)]
    assert [store.get(e) for e in eids] == [{"n": 1}, {"n": 1}, {}, {}]


def test_calls_of_different_partitions_are_not_merged(client: redis.Redis) -> None:
    ks = Keyspace("twq", partitions=4, tagged=True)
    eids = [f"pt{i}" for i in range(12)]
    store, gens = created(client, eids, ks)
    tags = {hash_tag(ks.own_keys(e)[0]) for e in eids}
    assert len(tags) > 1 and None not in tags
    calls = [step(store, e, gens[e], 1) for e in eids]
    _, outcomes, evalshas = sent_at_once(client, step(store, "pt0", 0, 0), calls)
    assert outcomes == [(True, False)] * len(eids)
    assert evalshas == len(tags)
    assert [client.get(f"app:{e}") for e in eids] == [b"1"] * len(eids)


def test_entries_keep_the_order_and_bound_a_batch() -> None:
    """Without I/O: a batch stands where its first call was, a lone call of a twin's script goes
    alone, other scripts alone, at most ``MAX_BATCH_CALLS`` calls a batch."""
    ks = DEFAULT
    run = scripts.script("checkpoint_running")
    other = scripts.script("renew_lease")
    client: Any = None

    def call(script: scripts.Script, eid: str) -> ScriptCall:
        return ScriptCall(client, script, [ks.own_keys(eid)[0]], [], lambda r: r)

    waiting: list[Any] = [(call(run, "a"), 1), (call(other, "b"), 2), (call(run, "c"), 3), (call(other, "d"), 4)]
    got = entries(waiting)
    assert isinstance(got[0], Batch) and [f for _, f in got[0].items] == [1, 3]
    assert got[1:] == [waiting[1], waiting[3]]
    assert entries(waiting[:2]) == waiting[:2]  # one call of the script: sent alone, no twin
    many = [(call(run, str(i)), i) for i in range(MAX_BATCH_CALLS + 2)]
    sizes = [len(e.items) if isinstance(e, Batch) else 1 for e in entries(many)]
    assert sizes == [MAX_BATCH_CALLS, 2]


def test_a_second_call_of_one_execution_is_never_moved_before_a_call_between_them() -> None:
    """Without I/O: in [run(a), other(x), run(x)] a batch of the two runs would send run(x)
    before other(x); it starts a new batch after other(x) instead. A key of no text type goes
    in no tagged batch."""
    ks = DEFAULT
    run = scripts.script("checkpoint_running")
    other = scripts.script("checkpoint_execution")

    def call(script: scripts.Script, eid: str) -> ScriptCall:
        return ScriptCall(None, script, [ks.own_keys(eid)[0]], [], lambda r: r)

    waiting: list[Any] = [(call(run, "a"), 1), (call(other, "x"), 2), (call(run, "x"), 3), (call(run, "b"), 4)]
    got = entries(waiting)
    order = [[f for _, f in e.items] if isinstance(e, Batch) else [e[1]] for e in got]
    assert order == [[1], [2], [3, 4]]
    assert hash_tag(7) is None and hash_tag("a{p1}b") == "p1" and hash_tag(b"{}x") is None


@pytest.mark.parametrize(("writes", "evalshas"), [(990, 1), (1000, 2)])
def test_a_call_near_luas_stack_limit_is_batched_and_one_past_it_goes_alone(
    client: redis.Redis, writes: int, evalshas: int
) -> None:
    """990 staged writes make 3968 arguments (a batch unpacks them); 1000 make 4008, over
    ``MAX_COUNT``: that call goes alone, its neighbour too (a batch of one)."""
    store, gens = created(client, ["big", "small"])
    staged = [Staged("incrby", f"app:big:{i}", "1") for i in range(writes)]
    big = checkpoint_call(
        client, store.ks, "big", gens["big"], "{}", status="running", now_s=time.time(), staged=staged
    )
    assert (len(big.args) <= MAX_COUNT) == (evalshas == 1)
    _, outcomes, sent = sent_at_once(client, step(store, "small", 0, 0), [big, step(store, "small", gens["small"], 1)])
    assert outcomes == [(True, False), (True, False)]
    assert sent == evalshas
    assert client.get(f"app:big:{writes - 1}") == b"1" and client.get("app:small") == b"1"


def test_a_batch_reply_read_a_byte_at_a_time_reaches_each_call_and_a_whole_batch_error_each(
    client: redis.Redis,
) -> None:
    """The far end of a socket pair played by hand: two writes of three calls each (one batch
    each); the first answered by an array holding an error, the second by one error reply
    (every call of that batch gets it), one byte per read."""
    store, gens = created(client, ["sp1"])
    template = step(store, "sp1", gens["sp1"], 1, running=True)
    calls = [  # six executions' calls (one execution's second call would start a new batch)
        dataclasses.replace(template, keys=[f"lease{i}", *template.keys[1:]], args=[str(i)], parse=lambda r: r)
        for i in range(6)
    ]
    replies = b"*3\r\n*2\r\n:1\r\n:0\r\n-ERR boom\r\n*2\r\n:0\r\n:0\r\n-READONLY not a master\r\n"
    near, far = socket.socketpair()
    near.setblocking(False)
    far.setblocking(False)

    async def scenario() -> tuple[list[Any], list[bytes]]:
        loop = asyncio.get_running_loop()
        conn = loop_calls._Connection(loop, client, near, 10.0, {})
        futures = [loop.create_future() for _ in calls]
        for i, (call, future) in enumerate(zip(calls, futures, strict=True)):
            conn.send(call, future)
            if i == 2:
                await asyncio.sleep(0)  # the first three written: the rest go in a second write
        wanted = sum(len(batch_scripts.packed(e)) for e in (batch_scripts.entries([(c, None) for c in calls[:3]])))
        wanted *= 2  # the second batch packs to as many bytes (one-digit args)
        received = await answer_bytewise(far, wanted, replies)
        outcomes = await asyncio.gather(*futures, return_exceptions=True)
        conn.close()
        return outcomes, received.split(b"EVALSHA")

    try:
        outcomes, written = asyncio.run(asyncio.wait_for(scenario(), 20))
    finally:
        far.close()
    assert len(written) == 3  # two EVALSHA: one batch per write
    assert outcomes[0] == [1, 0] and outcomes[2] == [0, 0], outcomes
    assert isinstance(outcomes[1], redis.ResponseError) and str(outcomes[1]) == "boom"
    assert all(isinstance(o, redis.ReadOnlyError) for o in outcomes[3:]), outcomes[3:]


def test_batched_calls_refused_over_maxmemory_each_get_the_oom_error(client: redis.Redis) -> None:
    """Over maxmemory each call's first write is refused: each gets OOM (as alone), none is
    re-sent, nothing is written."""
    eids = ["oom1", "oom2", "oom3"]
    store, gens = created(client, eids)
    calls = [step(store, e, gens[e], 1, running=True) for e in eids]
    with over_maxmemory(client):
        _, outcomes, evalshas = sent_at_once(client, step(store, "oom1", 0, 0, running=True), calls)
    assert evalshas == 1
    assert all(isinstance(o, redis.exceptions.OutOfMemoryError) for o in outcomes), [str(o) for o in outcomes]
    assert [store.get(e) for e in eids] == [{}] * len(eids)


def test_an_error_redis_call_raised_inside_a_batched_call_keeps_its_code(client: redis.Redis) -> None:
    """An error reply ``redis.call`` raises in a batched body (which a ``pcall`` in Redis 7.0
    receives as text) keeps its code: WRONGTYPE stays WRONGTYPE, OOM stays OutOfMemoryError as
    alone (and READONLY would stay ReadOnlyError, the runner's failover path), not ``ERR ...``.
    The twin's own loop around a one-line body."""
    twin = batch_of(scripts.script("checkpoint_running"))
    assert twin is not None
    client.set("typed", "x")
    body = "local function one(KEYS, ARGV) redis.call('ZADD', KEYS[1], 1, 'a') end\n"
    loop = twin.text[twin.text.index("\nlocal counts") :]
    reply = client.eval(body + loop, 1, "typed", struct.pack(">2H", 1, 0))
    assert isinstance(reply[0], redis.ResponseError) and str(reply[0]).startswith("WRONGTYPE"), reply
    with over_maxmemory(client):
        reply = client.eval(body + loop, 1, "fresh", struct.pack(">2H", 1, 0))
    assert isinstance(reply[0], redis.exceptions.OutOfMemoryError), reply
