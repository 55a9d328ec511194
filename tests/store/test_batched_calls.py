"""Checkpoints and creates sent in one pipeline (``plaita.store.calls.run_calls``, the runner's
``CallBatcher``) keep every guarantee of a call sent alone: each is fenced on its own (a stale
writer is refused, the others in its batch are written), each staged write runs exactly once
(also when Redis lost the scripts: NOSCRIPT re-sends only the calls it refused), and a
refusal or error reaches only the call it belongs to. Real Redis, real leases."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
import redis

from plaita.store.calls import ScriptCall, batchable, run_calls
from plaita.store.executions.execution_io import CallBatcher, checkpoint_call, checkpoint_now, create_call, create_now
from plaita.store.executions.store import ExecutionStore, Staged, StagedWriteRefused
from plaita.store.leases import Lease, LeaseManager

pytestmark = pytest.mark.redis


@pytest.fixture
def client(bclient: redis.Redis) -> redis.Redis:
    """A client with bytes replies, as the worker's (the name these tests were written with)."""
    return bclient


def created(client: redis.Redis, store: ExecutionStore, eids: list[str]) -> dict[str, int]:
    """Each execution created (state ``{}``) under a lease of its own: id -> generation."""
    leases = LeaseManager(client, consumer="batched", ttl_s=30.0)
    out: dict[str, int] = {}
    for eid in eids:
        lease = leases.acquire(eid)
        assert isinstance(lease, Lease)
        assert create_now(store, eid, lease.generation, "{}", time.time(), None)[0] == 1
        out[eid] = lease.generation
    return out


def checkpoint(store: ExecutionStore, eid: str, generation: int, n: int, **kw: Any) -> ScriptCall:
    return checkpoint_call(
        store.client, store.ks, eid, generation, json.dumps({"n": n}), status="running", now_s=time.time(), **kw
    )


def test_one_pipeline_fences_each_call_on_its_own(client: redis.Redis) -> None:
    store = ExecutionStore(client)
    gens = created(client, store, ["b1", "b2", "b3"])
    calls = [
        checkpoint(store, "b1", gens["b1"], 1, staged=[Staged("incrby", "app:b1", "1")]),
        checkpoint(store, "b2", gens["b2"] - 1, 1, staged=[Staged("incrby", "app:b2", "1")]),  # a stale writer
        checkpoint(store, "b3", gens["b3"], 1, staged=[Staged("incrby", "app:b3", "1")]),
    ]
    assert batchable(client)
    assert run_calls(client, calls) == [(True, False), (False, False), (True, False)]
    assert [store.get(e) for e in ("b1", "b2", "b3")] == [{"n": 1}, {}, {"n": 1}]
    assert [client.get(f"app:{e}") for e in ("b1", "b2", "b3")] == [b"1", None, b"1"]


def test_a_refused_staged_write_fails_only_its_own_call(client: redis.Redis) -> None:
    store = ExecutionStore(client)
    gens = created(client, store, ["r1", "r2"])
    client.rpush("app:r1:list", "x")
    calls = [
        checkpoint(store, "r1", gens["r1"], 1, staged=[Staged("incrby", "app:r1:list", "1")]),
        checkpoint(store, "r2", gens["r2"], 1, staged=[Staged("set", "app:r2", "v")]),
    ]
    refused, written = run_calls(client, calls)
    assert isinstance(refused, StagedWriteRefused)
    assert written == (True, False)
    assert store.get("r1") == {} and store.get("r2") == {"n": 1}
    assert client.get("app:r2") == b"v"


def test_noscript_resends_only_the_refused_calls(client: redis.Redis) -> None:
    """SCRIPT FLUSH between batches (a restarted server): every call of the next batch is
    refused with NOSCRIPT and sent again once; each INCRBY is applied exactly once."""
    store = ExecutionStore(client)
    eids = [f"ns{i}" for i in range(4)]
    gens = created(client, store, eids)
    client.script_flush()
    calls = [checkpoint(store, e, gens[e], 1, staged=[Staged("incrby", "app:ns:count", "1")]) for e in eids]
    assert run_calls(client, calls) == [(True, False)] * len(eids)
    assert client.get("app:ns:count") == str(len(eids)).encode()


#: The batcher's two ways: its I/O thread, and the loop's own connection (plaita.store.executions.loop_calls).
WAYS = pytest.mark.parametrize("loop_connection", [False, True], ids=["thread", "loop"])


@WAYS
def test_batcher_resolves_each_await_with_its_own_outcome(client: redis.Redis, loop_connection: bool) -> None:
    store = ExecutionStore(client)
    eids = [f"cb{i}" for i in range(16)]
    gens = created(client, store, eids)
    client.set("app:cb:wrong", "text")
    batcher = CallBatcher(loop_connection=loop_connection)

    async def all_at_once() -> list[Any]:
        calls = [checkpoint(store, e, gens[e] + (1 if e == "cb3" else 0), 2) for e in eids]
        calls.append(checkpoint(store, "cb0", gens["cb0"], 3, staged=[Staged("incrby", "app:cb:wrong", "1")]))
        return await asyncio.gather(*(batcher.run(c) for c in calls), return_exceptions=True)

    try:
        outcomes = asyncio.run(all_at_once())
    finally:
        batcher.stop()
    assert outcomes[:16] == [(False, False) if e == "cb3" else (True, False) for e in eids]
    assert isinstance(outcomes[16], StagedWriteRefused)
    assert store.get("cb0") == {"n": 2} and store.get("cb3") == {}
    assert client.get("app:cb:wrong") == b"text"


@WAYS
def test_batcher_reports_a_connection_error_to_every_waiting_call(private_redis: Any, loop_connection: bool) -> None:
    client = redis.Redis.from_url(private_redis.url, socket_timeout=5)
    store = ExecutionStore(client)
    gens = created(client, store, ["ce1", "ce2"])
    calls = [checkpoint(store, e, gens[e], 1) for e in ("ce1", "ce2")]
    private_redis.kill()
    batcher = CallBatcher(loop_connection=loop_connection)

    async def both() -> list[Any]:
        return await asyncio.gather(*(batcher.run(c) for c in calls), return_exceptions=True)

    try:
        outcomes = asyncio.run(both())
    finally:
        batcher.stop()
        client.close()
    assert all(isinstance(o, redis.ConnectionError) for o in outcomes), outcomes


@WAYS
def test_a_stopped_batcher_refuses_new_calls(client: redis.Redis, loop_connection: bool) -> None:
    store = ExecutionStore(client)
    gens = created(client, store, ["st1"])
    batcher = CallBatcher(loop_connection=loop_connection)
    batcher.stop()
    with pytest.raises(RuntimeError, match="closed"):
        asyncio.run(batcher.run(checkpoint(store, "st1", gens["st1"], 1)))
    assert store.get("st1") == {}


def test_loop_connection_resends_only_the_calls_refused_with_noscript(client: redis.Redis) -> None:
    """A restarted server's empty script cache, met on the loop connection: each staged INCRBY
    is applied exactly once, and a stale writer among them is still refused."""
    store = ExecutionStore(client)
    eids = [f"lns{i}" for i in range(6)]
    gens = created(client, store, eids)
    batcher = CallBatcher(loop_connection=True)

    async def warm_then_flushed() -> list[Any]:
        await batcher.run(checkpoint(store, eids[0], gens[eids[0]], 1))  # the connection is up
        client.script_flush()
        calls = [
            checkpoint(store, e, gens[e] - (1 if e == "lns2" else 0), 2, staged=[Staged("incrby", "app:lns", "1")])
            for e in eids
        ]
        return await asyncio.gather(*(batcher.run(c) for c in calls), return_exceptions=True)

    try:
        outcomes = asyncio.run(warm_then_flushed())
    finally:
        batcher.stop()
    assert outcomes == [(False, False) if e == "lns2" else (True, False) for e in eids]
    assert client.get("app:lns") == str(len(eids) - 1).encode()
    assert store.get("lns2") == {} and store.get("lns5") == {"n": 2}


def test_loop_connection_times_out_a_stalled_server(private_redis: Any) -> None:
    """No reply within the client's socket_timeout: the waiting call fails with TimeoutError
    (as a blocking call would) instead of waiting forever; the next call connects anew."""
    client = redis.Redis.from_url(private_redis.url, socket_timeout=0.5)
    admin = redis.Redis.from_url(private_redis.url, socket_timeout=5)
    store = ExecutionStore(client)
    gens = created(client, store, ["to1"])
    batcher = CallBatcher(loop_connection=True)

    async def stalled() -> tuple[Any, Any]:
        await batcher.run(checkpoint(store, "to1", gens["to1"], 1))
        admin.client_pause(60_000, all=False)  # WRITE: EVALSHA waits, CLIENT UNPAUSE does not
        try:
            stuck = await asyncio.gather(batcher.run(checkpoint(store, "to1", gens["to1"], 2)), return_exceptions=True)
        finally:
            admin.client_unpause()
        return stuck[0], await batcher.run(checkpoint(store, "to1", gens["to1"], 3))

    try:
        stuck, after = asyncio.run(stalled())
    finally:
        batcher.stop()
        admin.close()
        client.close()
    assert isinstance(stuck, redis.TimeoutError), stuck
    assert after == (True, False)


def test_loop_connection_reconnects_after_the_server_dropped_it(client: redis.Redis) -> None:
    """CLIENT KILL of the loop's connection: calls sent on it before the loop saw it close fail
    as disconnected (nothing is retried blindly), and a later call goes over a new connection."""
    store = ExecutionStore(client)
    gens = created(client, store, ["rc1"])
    batcher = CallBatcher(loop_connection=True)

    async def dropped() -> list[Any]:
        outcomes: list[Any] = [await batcher.run(checkpoint(store, "rc1", gens["rc1"], 1))]
        client.client_kill_filter(_type="normal", skipme=True)
        for n in range(2, 50):  # bounded: one failure at most is expected, then a new connection
            try:
                outcomes.append(await batcher.run(checkpoint(store, "rc1", gens["rc1"], n)))
                return outcomes
            except redis.ConnectionError as exc:
                outcomes.append(exc)
        return outcomes

    try:
        outcomes = asyncio.run(dropped())
    finally:
        batcher.stop()
    assert outcomes[0] == (True, False) and outcomes[-1] == (True, False)
    assert all(isinstance(o, redis.ConnectionError) for o in outcomes[1:-1]) and len(outcomes) <= 3, outcomes


def test_loop_connection_sends_a_write_larger_than_the_socket_takes_at_once(client: redis.Redis) -> None:
    """Documents of several MB: the socket takes part of the write, the rest goes out when it
    has room, in order, and every call gets its own reply."""
    store = ExecutionStore(client)
    eids = ["big1", "big2", "big3"]
    gens = created(client, store, eids)
    batcher = CallBatcher(loop_connection=True)
    blob = "x" * (6 << 20)

    async def big() -> list[Any]:
        calls = [
            checkpoint_call(
                store.client,
                store.ks,
                e,
                gens[e],
                json.dumps({"n": i, "blob": blob}),
                status="running",
                now_s=time.time(),
            )
            for i, e in enumerate(eids)
        ]
        return await asyncio.gather(*(batcher.run(c) for c in calls), return_exceptions=True)

    try:
        outcomes = asyncio.run(big())
    finally:
        batcher.stop()
    assert outcomes == [(True, False)] * len(eids)
    for i, e in enumerate(eids):
        doc = store.get(e)
        assert doc is not None and doc["n"] == i and len(doc["blob"]) == len(blob)


#: The three ways a batch goes out: ``run_calls`` itself, and the batcher's two ways.
SENDERS = pytest.mark.parametrize("sender", ["run_calls", "thread", "loop"])


def _send_all(client: redis.Redis, calls: list[ScriptCall], sender: str) -> list[Any]:
    """Each call's outcome, the calls sent as one batch (``run_calls``) or through a batcher."""
    if sender == "run_calls":
        return run_calls(client, calls)
    batcher = CallBatcher(loop_connection=sender == "loop")

    async def together() -> list[Any]:
        return await asyncio.gather(*(batcher.run(c) for c in calls), return_exceptions=True)

    try:
        return asyncio.run(asyncio.wait_for(together(), 30))
    finally:
        batcher.stop()


@SENDERS
def test_noscript_in_a_mixed_batch_resends_only_the_refused_call_never_one_that_ran(
    client: redis.Redis, sender: str
) -> None:
    """Guards issue 31: a NOSCRIPT in a pipelined batch must re-send only the calls Redis refused.
    One script is loaded (the checkpoint's), another is not (the create's), as after a restart
    that only some calls have met since: the checkpoint in the batch runs, the create is refused.
    Re-sending the whole batch once the create's script is loaded ran the checkpoint twice and
    applied its staged INCRBY twice (the bug put in by hand: ``run_calls`` re-executing the
    whole pipeline on a NoScriptError)."""
    store = ExecutionStore(client)
    gens = created(client, store, ["mx1"])
    leases = LeaseManager(client, consumer="mixed", ttl_s=30.0)
    lease = leases.acquire("mx2")
    assert isinstance(lease, Lease)
    client.script_flush()
    assert checkpoint_now(store, "mx1", gens["mx1"], "{}", status="running", now_s=time.time()) == (True, False)
    checkpoint_sha, create_sha = (
        checkpoint(store, "mx1", 0, 0).script.sha,
        create_call(store.client, store.ks, "x", 1, "{}", 0.0, None).script.sha,
    )
    assert client.script_exists(checkpoint_sha, create_sha) == [True, False]  # the mix the bug needs
    calls = [
        checkpoint(store, "mx1", gens["mx1"], 1, staged=[Staged("incrby", "app:mx:count", "1")]),
        create_call(store.client, store.ks, "mx2", lease.generation, "{}", time.time(), None),
        checkpoint(store, "mx1", gens["mx1"], 2, staged=[Staged("incrby", "app:mx:count", "10")]),
    ]
    outcomes = _send_all(client, calls, sender)
    assert outcomes[0] == (True, False) and outcomes[2] == (True, False), outcomes
    assert outcomes[1][0] == 1, outcomes  # created
    assert client.get("app:mx:count") == b"11"  # each INCRBY once: 1 + 10
    assert store.get("mx1") == {"n": 2} and store.get("mx2") == {}


def test_a_batch_of_more_than_max_batch_calls_answers_every_call(client: redis.Redis) -> None:
    """Guards issue 31: the batcher's thread takes at most ``MAX_BATCH`` (256) queued calls per
    round trip and must keep the rest for the next one. The bug put in by hand, dropping what
    was queued past the first 256 (``self._queued = []``), left 43 of 300 awaits unanswered
    for ever (here: the bounded wait fails). The server is paused while the calls queue, so the
    thread finds all 299 queued at once behind the first call."""
    from plaita.store.executions import thread_calls as batch_module

    store = ExecutionStore(client)
    n = batch_module.MAX_BATCH + 44
    eids = [f"mb{i}" for i in range(n)]
    gens = created(client, store, eids)
    calls = [checkpoint(store, e, gens[e], 1, staged=[Staged("incrby", "app:mb:count", "1")]) for e in eids]
    admin = redis.Redis(connection_pool=redis.ConnectionPool(**client.connection_pool.connection_kwargs))
    batcher = CallBatcher(loop_connection=False)

    def queued() -> int:
        with batcher.threaded._cond:
            return len(batcher.threaded._queued)

    async def held_then_released() -> list[Any]:
        admin.client_pause(30_000, all=False)  # WRITE: the EVALSHAs wait, CLIENT UNPAUSE does not
        try:
            first = asyncio.ensure_future(batcher.run(calls[0]))
            await _until(
                lambda: batcher.threaded._thread is not None and queued() == 0, "the thread to take the first call"
            )
            rest = [asyncio.ensure_future(batcher.run(c)) for c in calls[1:]]
            await _until(lambda: queued() == n - 1, f"{n - 1} calls queued behind the first")
        finally:
            admin.client_unpause()
        return await asyncio.wait_for(asyncio.gather(first, *rest, return_exceptions=True), 20)

    try:
        outcomes = asyncio.run(held_then_released())
    finally:
        batcher.stop()
        admin.close()
    assert outcomes == [(True, False)] * n
    assert client.get("app:mb:count") == str(n).encode()


async def _until(predicate: Any, what: str, timeout_s: float = 10.0) -> None:
    """Poll ``predicate`` with the loop running, up to ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        await asyncio.sleep(0.005)
