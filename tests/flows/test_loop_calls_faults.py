"""The loop connection (``plaita.store.executions.loop_calls``) under faults, on a real private server:
redis-py internals gone (it falls back to the thread, once, with a warning), an error reply it
cannot parse (that call fails, nothing hangs), a connect that outlives ``stop`` or all of its
callers (its socket is still closed), a Unix socket with an ACL user and a db other than 0,
a SIGSTOP past ``socket_timeout``, a blackhole, and kill -9 with a restart (scripts gone).
Every staged INCRBY is applied at most once: a call whose outcome is unknown is never resent."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hiredis
import pytest
import redis

from plaita.flows.producer.client import FlowClient
from plaita.ops.service import start_worker
from plaita.store import scripts
from plaita.store.calls import ScriptCall
from plaita.store.executions import loop_calls
from plaita.store.executions.execution_io import CallBatcher
from plaita.store.executions.store import ExecutionStore
from tests.support.flow_calls import answer_bytewise, created
from tests.support.flow_calls import step as counted_step
from tests.support.lease_workers import QUEUE, settings
from tests.support.proxy import FaultProxy
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.redis


def lf_step(store: ExecutionStore, eid: str, generation: int, n: int) -> ScriptCall:
    """A running checkpoint applying INCRBY 1 to the shared counter ``app:lf``."""
    return counted_step(store, eid, generation, n, counter="app:lf")


def wait_until(predicate: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def loop_connections(admin: redis.Redis) -> int:
    """Connections other than ``admin``'s own that ran EVALSHA last (the loop's)."""
    return sum(1 for c in admin.client_list() if c.get("cmd") == "evalsha")


def test_the_redis_py_internals_it_relies_on_exist(client: redis.Redis) -> None:
    """So a redis-py upgrade that drops them is seen here, not only as the warning below."""
    assert loop_calls._parse_error is not None
    assert isinstance(loop_calls._parse_error("NOSCRIPT No matching script."), redis.exceptions.NoScriptError)
    sock = loop_calls._connected_socket(client)
    try:
        assert sock.getpeername()[1] == client.connection_pool.connection_kwargs["port"]
    finally:
        sock.close()


def test_without_the_socket_attribute_calls_go_through_the_thread_with_one_warning(
    client: redis.Redis, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A redis-py that keeps its socket elsewhere: nothing fails, the thread batcher sends."""
    monkeypatch.setattr(loop_calls, "_SOCK_ATTRIBUTE", "_renamed_in_a_later_redis_py")
    eids = [f"ns{i}" for i in range(5)]
    store, gens = created(client, eids)
    batcher = CallBatcher(loop_connection=True)

    async def calls() -> list[Any]:
        return await asyncio.gather(*(batcher.run(lf_step(store, e, gens[e], 1)) for e in eids), return_exceptions=True)

    with caplog.at_level(logging.WARNING, logger="plaita.store.executions.execution_io"):
        try:
            outcomes = asyncio.run(calls())
        finally:
            batcher.stop()
    assert outcomes == [(True, False)] * len(eids)
    assert client.get("app:lf") == b"5"
    assert sum("loop connection" in r.getMessage() for r in caplog.records) == 1, caplog.records


def test_without_parse_error_calls_go_through_the_thread(client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loop_calls, "_parse_error", None)
    store, gens = created(client, ["np1"])
    batcher = CallBatcher(loop_connection=True)
    try:
        assert asyncio.run(batcher.run(lf_step(store, "np1", gens["np1"], 1))) == (True, False)
    finally:
        batcher.stop()
    assert client.get("app:lf") == b"1"


def test_an_error_reply_that_cannot_be_parsed_fails_its_call_and_hangs_nothing(
    client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NOSCRIPT read by a redis-py whose parse_error raises: that call ends in ConnectionError
    (nothing hangs on a reply the loop could not settle), and nothing runs twice."""
    store, gens = created(client, ["pe1"])
    batcher = CallBatcher(loop_connection=True)

    def broken(_: str) -> Exception:
        raise ValueError("a redis-py whose parse_error changed")

    async def scenario() -> Any:
        assert await batcher.run(lf_step(store, "pe1", gens["pe1"], 1)) == (True, False)  # the connection is up
        client.script_flush()
        monkeypatch.setattr(loop_calls, "_parse_error", broken)
        # bounded: before the fix this call's future was dropped, never resolved (a hung step)
        done = await asyncio.gather(
            asyncio.wait_for(batcher.run(lf_step(store, "pe1", gens["pe1"], 2)), 20), return_exceptions=True
        )
        return done[0]

    try:
        outcome = asyncio.run(scenario())
    finally:
        batcher.stop()
    assert isinstance(outcome, redis.ConnectionError), repr(outcome)
    assert client.get("app:lf") == b"1" and store.get("pe1") == {"n": 1}


class HeldConnect:
    """``_connected_socket`` held until ``release``: a connect still under way."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.entered, self.release = threading.Event(), threading.Event()
        self.socks: list[socket.socket] = []
        real = loop_calls._connected_socket

        def held(client: redis.Redis) -> socket.socket:
            self.entered.set()
            assert self.release.wait(10), "never released"
            sock = real(client)
            self.socks.append(sock)
            return sock

        monkeypatch.setattr(loop_calls, "_connected_socket", held)


async def settled(calls: loop_calls.LoopCalls) -> None:
    deadline = time.monotonic() + 10
    while calls._connecting:
        assert time.monotonic() < deadline, "connect never ended"
        await asyncio.sleep(0.01)


def test_a_connect_that_ends_after_stop_is_closed_and_sends_nothing(
    client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, gens = created(client, ["cs1"])
    held = HeldConnect(monkeypatch)
    batcher = CallBatcher(loop_connection=True)

    async def scenario() -> Any:
        call = asyncio.ensure_future(batcher.run(lf_step(store, "cs1", gens["cs1"], 1)))
        assert await asyncio.to_thread(held.entered.wait, 10)
        batcher.stop()  # the worker stops while the loop's connection is still being made
        held.release.set()
        return (await asyncio.gather(call, return_exceptions=True))[0]

    outcome = asyncio.run(scenario())
    assert isinstance(outcome, RuntimeError), repr(outcome)
    assert [s.fileno() for s in held.socks] == [-1]  # closed, not left open with a reader on it
    assert store.get("cs1") == {} and client.get("app:lf") is None


def test_a_connect_whose_callers_were_all_cancelled_is_closed_by_stop(
    client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, gens = created(client, ["cc1"])
    held = HeldConnect(monkeypatch)
    batcher = CallBatcher(loop_connection=True)
    assert batcher._loop_calls is not None
    calls = batcher._loop_calls

    async def scenario() -> None:
        call = asyncio.ensure_future(batcher.run(lf_step(store, "cc1", gens["cc1"], 1)))
        assert await asyncio.to_thread(held.entered.wait, 10)
        call.cancel()  # the step awaiting it was cancelled
        held.release.set()
        await settled(calls)
        batcher.stop()

    asyncio.run(scenario())
    assert len(held.socks) == 1 and held.socks[0].fileno() == -1


def test_unix_socket_acl_user_and_a_db_other_than_0(tmp_path: Path) -> None:
    path = str(tmp_path / "r.sock")
    with RedisServer(persist=False, extra_args=["--unixsocket", path, "--unixsocketperm", "700"]) as server:
        admin = server.client()
        admin.acl_setuser("flows", enabled=True, passwords=["+s3cret"], keys=["~*"], commands=["+@all"])
        client = redis.Redis.from_url(f"unix://flows:s3cret@{path}?db=3", socket_timeout=5)
        store, gens = created(client, ["ux1", "ux2"])
        batcher = CallBatcher(loop_connection=True)

        async def calls() -> list[Any]:
            return await asyncio.gather(*(batcher.run(lf_step(store, e, gens[e], 1)) for e in gens))

        try:
            outcomes = asyncio.run(calls())
            loop_conn = [c for c in admin.client_list() if c.get("cmd") == "evalsha"]
        finally:
            batcher.stop()
            client.close()
        assert outcomes == [(True, False)] * 2
        assert len(loop_conn) >= 2 and {(c["user"], c["db"]) for c in loop_conn} == {("flows", "3")}, (
            loop_conn
        )  # pool + loop
        assert (
            admin.get("app:lf") is None and redis.Redis.from_url(server.url.replace("/0", "/3")).get("app:lf") == b"2"
        )
        admin.close()


EIDS = [f"fx{i}" for i in range(6)]


def outage(url: str, fault: Callable[[], object], heal: Callable[[], None]) -> tuple[list[Any], list[Any]]:
    """Calls in flight on the loop connection when ``fault`` strikes, and one more per
    execution after ``heal``: (the outcomes of the first, of the second)."""
    admin = redis.Redis.from_url(url, socket_timeout=5)
    gens = created(admin, EIDS)[1]
    admin.close()
    client = redis.Redis.from_url(url, socket_timeout=0.5)  # the loop connection's reply timeout
    store = ExecutionStore(client)
    batcher = CallBatcher(loop_connection=True)

    async def scenario() -> tuple[list[Any], list[Any]]:
        assert await batcher.run(counted_step(store, EIDS[0], gens[EIDS[0]], 1, counter=f"app:{EIDS[0]}:warm")) == (
            True,
            False,
        )
        fault()
        try:
            struck = await asyncio.gather(
                *(batcher.run(counted_step(store, e, gens[e], 2, counter=f"app:{e}")) for e in EIDS),
                return_exceptions=True,
            )
        finally:
            heal()
        after = await asyncio.gather(
            *(batcher.run(counted_step(store, e, gens[e], 3, counter=f"app:{e}")) for e in EIDS), return_exceptions=True
        )
        return struck, after

    try:
        return asyncio.run(asyncio.wait_for(scenario(), 60))
    finally:
        batcher.stop()
        client.close()


def applied_at_most_once(url: str, struck: list[Any], after: list[Any]) -> None:
    """The calls after the outage ran once each; the struck ones at most once (never resent)."""
    admin = redis.Redis.from_url(url, socket_timeout=5)
    assert after == [(True, False)] * len(EIDS), after
    for eid, outcome in zip(EIDS, struck, strict=True):
        ran = int(admin.get(f"app:{eid}") or 0)
        assert ran in ((1, 2) if isinstance(outcome, redis.RedisError) else (2,)), (eid, outcome, ran)
    admin.close()


def test_a_freeze_past_socket_timeout_fails_every_waiting_call_and_resends_none(private_redis: RedisServer) -> None:
    struck, after = outage(private_redis.url, private_redis.freeze, private_redis.thaw)
    assert all(isinstance(o, redis.TimeoutError) for o in struck), struck
    applied_at_most_once(private_redis.url, struck, after)


def test_a_blackhole_fails_every_waiting_call_and_resends_none(private_redis: RedisServer) -> None:
    with FaultProxy(private_redis.port) as proxy:
        struck, after = outage(proxy.url, proxy.blackhole, proxy.restore)
    assert all(isinstance(o, redis.TimeoutError) for o in struck), struck
    applied_at_most_once(private_redis.url, struck, after)


def test_connection_resets_fail_the_waiting_calls_as_disconnected(private_redis: RedisServer) -> None:
    with FaultProxy(private_redis.port) as proxy:
        resets: list[int] = []
        struck, after = outage(proxy.url, lambda: resets.append(proxy.reset_all()), lambda: None)
    assert resets[0] >= 1  # the loop's connection (and the warm-up's) were reset
    assert all(o == (True, False) or isinstance(o, redis.ConnectionError) for o in struck), struck
    applied_at_most_once(private_redis.url, struck, after)


def test_kill9_and_a_restart_with_data_reload_the_scripts_and_apply_each_call_once(private_redis: RedisServer) -> None:
    """The calls in flight fail as disconnected; after the restart the script cache is empty:
    NOSCRIPT re-sends only the refused calls, each applied once."""
    struck, after = outage(private_redis.url, private_redis.kill, private_redis.start)
    assert all(isinstance(o, redis.ConnectionError) for o in struck), struck
    applied_at_most_once(private_redis.url, struck, after)


def test_stop_from_another_thread_fails_the_calls_waiting_on_a_frozen_server(private_redis: RedisServer) -> None:
    """The worker's loop runs on a thread of its own and the runner is closed from another:
    every waiting call hears of it as disconnected (no hung step), the socket is closed."""
    admin = private_redis.client()
    gens = created(admin, EIDS)[1]
    client = redis.Redis.from_url(private_redis.url, socket_timeout=30)  # far longer than the test
    store = ExecutionStore(client)
    batcher = CallBatcher(loop_connection=True)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        warm = asyncio.run_coroutine_threadsafe(batcher.run(lf_step(store, EIDS[0], gens[EIDS[0]], 1)), loop)
        assert warm.result(10) == (True, False)
        assert batcher._loop_calls is not None
        conn = next(iter(batcher._loop_calls._conns.values()))
        private_redis.freeze()
        waiting = [asyncio.run_coroutine_threadsafe(batcher.run(lf_step(store, e, gens[e], 2)), loop) for e in EIDS]
        wait_until(lambda: conn.waiting_calls() == len(EIDS), "every call sent")
        batcher.stop()
        outcomes = [f.exception(10) for f in waiting]
    finally:
        if private_redis.frozen:
            private_redis.thaw()
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
        client.close()
        admin.close()
    assert all(isinstance(o, redis.ConnectionError) and "closed" in str(o) for o in outcomes), outcomes
    assert conn.sock.fileno() == -1


def test_calls_in_flight_when_the_loop_ends_leave_no_socket_open(client: redis.Redis) -> None:
    """``asyncio.run`` returns with calls still unanswered (their tasks cancelled); the runner
    is closed afterwards, on a closed loop: the socket is closed, nothing raises."""
    store, gens = created(client, EIDS)
    batcher = CallBatcher(loop_connection=True)
    conns: list[Any] = []

    async def leave_in_flight() -> None:
        await batcher.run(lf_step(store, EIDS[0], gens[EIDS[0]], 1))
        for e in EIDS:
            asyncio.ensure_future(batcher.run(lf_step(store, e, gens[e], 2)))
        await asyncio.sleep(0)  # the calls are queued on the connection, not yet answered
        assert batcher._loop_calls is not None
        conns.extend(batcher._loop_calls._conns.values())

    asyncio.run(leave_in_flight())
    batcher.stop()
    assert len(conns) == 1 and conns[0].sock.fileno() == -1
    assert int(client.get("app:lf") or 0) <= 1 + len(EIDS)  # those sent ran once at most


def test_replies_read_a_byte_at_a_time_each_reach_their_own_call(client: redis.Redis) -> None:
    """The loop end of a socket pair, its far end played by hand: pipelined replies (an
    integer, an error, a bulk string, an array, an integer) arriving one byte per read are
    each matched to the call they answer, in order, and the error reaches only its own."""
    store, gens = created(client, ["pr1"])
    template = lf_step(store, "pr1", gens["pr1"], 1)
    alone = scripts.script("fenced_set")  # no batch twin: five calls, five replies
    calls = [dataclasses.replace(template, script=alone, args=[str(i)], parse=lambda r: r) for i in range(5)]
    replies = b":0\r\n-ERR boom\r\n$5\r\nhello\r\n*2\r\n:1\r\n:2\r\n:4\r\n"
    near, far = socket.socketpair()
    near.setblocking(False)
    far.setblocking(False)

    async def scenario() -> list[Any]:
        loop = asyncio.get_running_loop()
        conn = loop_calls._Connection(loop, client, near, 10.0, {})
        futures = [loop.create_future() for _ in calls]
        for call, future in zip(calls, futures, strict=True):
            conn.send(call, future)
        wanted = sum(len(hiredis.pack_command(("EVALSHA", c.script.sha, 1, *c.keys, *c.args))) for c in calls)
        await answer_bytewise(far, wanted, replies)
        outcomes = await asyncio.gather(*futures, return_exceptions=True)
        conn.close()
        return outcomes

    try:
        outcomes = asyncio.run(asyncio.wait_for(scenario(), 20))
    finally:
        far.close()
    assert outcomes[0] == 0 and outcomes[2] == b"hello" and outcomes[3] == [1, 2] and outcomes[4] == 4, outcomes
    assert isinstance(outcomes[1], redis.ResponseError) and str(outcomes[1]) == "boom"
    assert near.fileno() == -1


def test_a_stopped_flow_worker_closes_its_loop_connection(private_redis: RedisServer) -> None:
    """``start_worker(flows=...)`` then ``stop``: the runner's loop connection is closed with
    it (not left open until the process exits, as an embedding application would see)."""
    admin = private_redis.client()
    service = start_worker(settings(private_redis.url, "loopstop", concurrency=2), flows=["tests.chaos.loopflows"])
    try:
        flows = FlowClient.from_url(private_redis.url, queue_name=QUEUE, socket_timeout_s=5.0)
        eids = [flows.start("relay", {"pause_s": 0.0}) for _ in range(3)]
        assert all(flows.wait(eid, 30)["status"] == "completed" for eid in eids)
        flows.close()
        assert loop_connections(admin) >= 1  # the worker's loop connection (and its pool's)
    finally:
        assert service.stop(20)
    wait_until(lambda: loop_connections(admin) == 0, "the worker's connections closed")
    admin.close()
