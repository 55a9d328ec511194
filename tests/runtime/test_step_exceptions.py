"""Every exception a handler or a flow step can raise is a failed attempt, and its slot comes back.

The whole builtin ``BaseException`` hierarchy (walked through ``__subclasses__``, plus asyncio's
``CancelledError`` and a user-defined ``BaseException`` subclass) is raised by a sync and an async
handler and by a sync and an async flow step, on both pools, with ``--concurrency 1``:

- a handler's raise is a failed delivery: redelivered, then dead-lettered at ``max_deliveries``;
- a step's raise is a failed attempt: retried under the step's policy, then the execution ends
  in ``error`` naming the exception (never a redelivery, never the DLQ);
- after all of them a plain task still completes on the one slot (nothing wedged it).

One worker per mode runs every exception (a worker per exception would take minutes); each
exception is still its own test, reading its own outcome from the mode's run. Nothing is
skipped: the five classes that take more than one argument (the exception groups and the
Unicode errors) are built with the arguments they need.
"""

from __future__ import annotations

import asyncio
import builtins
import json
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis

from plaita.errors import LeaseLostError
from plaita.flows import Flow, FlowRunner, RetryPolicy, StepContext
from plaita.flows.producer.client import FlowClient
from plaita.runtime.aio_pool import AsyncHandlerPool
from plaita.runtime.outcomes import DEAD, RETRY, Outcome
from plaita.runtime.pool import HandlerPool, judge
from plaita.store.client import make_client
from plaita.store.executions.store import ExecutionStore
from plaita.store.streams.queue import StreamQueue
from plaita.tasks import Task
from tests.support.lease_workers import GROUP, QUEUE, inproc_worker, settings, wait_for, worker_proc
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.redis

MAX_DELIVERIES = 2
MAX_ATTEMPTS = 2


class UserBaseError(BaseException):
    """What a library might define to get past ``except Exception``."""


def _walk(cls: type[BaseException]) -> Iterator[type[BaseException]]:
    yield cls
    for sub in cls.__subclasses__():
        yield from _walk(sub)


#: Classes whose constructor takes more than one argument, built as they need.
_SPECIAL: dict[type[BaseException], Callable[[str], BaseException]] = {
    BaseExceptionGroup: lambda m: BaseExceptionGroup(m, [GeneratorExit(), KeyboardInterrupt()]),
    ExceptionGroup: lambda m: ExceptionGroup(m, [ValueError(m)]),
    UnicodeDecodeError: lambda m: UnicodeDecodeError("utf-8", b"\xff", 0, 1, m),
    UnicodeEncodeError: lambda m: UnicodeEncodeError("ascii", "\u20ac", 0, 1, m),
    UnicodeTranslateError: lambda m: UnicodeTranslateError("\u20ac", 0, 1, m),
}


def _hierarchy() -> dict[str, Callable[[str], BaseException]]:
    found: dict[str, Callable[[str], BaseException]] = {}
    for cls in _walk(BaseException):
        # Only the builtins themselves (C extensions may name their classes' module "builtins").
        if getattr(builtins, cls.__name__, None) is cls and cls.__name__ not in found:
            found[cls.__name__] = _SPECIAL.get(cls, cls)
    found["asyncio.CancelledError"] = asyncio.CancelledError
    found["UserBaseError"] = UserBaseError
    return found


EXCEPTIONS = _hierarchy()
assert {"GeneratorExit", "KeyboardInterrupt", "SystemExit", "StopIteration", "StopAsyncIteration"} <= set(EXCEPTIONS)
assert {"BaseExceptionGroup", "ExceptionGroup"} <= set(EXCEPTIONS) and len(EXCEPTIONS) > 60


def _raise(name: str) -> None:
    raise EXCEPTIONS[name](f"raised by test {name}")


def _raise_in_thread(name: str) -> Any:
    """An awaitable resolved with the exception: the loop *throws* it into the awaiting coroutine
    (a thrown GeneratorExit closes every coroutine up to the task's own). StopIteration cannot
    resolve a future at all (asyncio refuses it), so that one is raised straight away."""
    if name == "StopIteration":
        _raise(name)
    return asyncio.to_thread(_raise, name)


def _expected_type(name: str, coroutine: bool) -> str:
    """The class name the failure is recorded under: Python itself turns a StopIteration leaving
    a coroutine into RuntimeError (PEP 479)."""
    raised = name.rpartition(".")[2]
    return "RuntimeError" if coroutine and raised == "StopIteration" else raised


# -- handlers ---------------------------------------------------------------------------


def sync_handler(task: Task) -> None:
    name = (task.body.get("params") or {}).get("raise")
    if name:
        _raise(name)


async def async_handler(task: Task) -> None:
    name = (task.body.get("params") or {}).get("raise")
    await asyncio.sleep(0)
    if name:
        _raise(name)


async def awaiting_handler(task: Task) -> None:
    name = (task.body.get("params") or {}).get("raise")
    if name:
        await _raise_in_thread(name)


# -- flows: one step raising, by params, the way the mode asks ----------------------------

_POLICY = RetryPolicy(max_attempts=MAX_ATTEMPTS, base_s=0.0, cap_s=0.0)
sync_flow = Flow("raise_sync", retry=_POLICY)
async_flow = Flow("raise_async", retry=_POLICY)
awaiting_flow = Flow("raise_awaited", retry=_POLICY)


@sync_flow.step
def sync_step(ctx: StepContext) -> dict[str, Any]:
    if ctx.params.get("raise"):
        _raise(ctx.params["raise"])
    return {"ok": True}


@async_flow.step
async def async_step(ctx: StepContext) -> dict[str, Any]:
    await asyncio.sleep(0)
    if ctx.params.get("raise"):
        _raise(ctx.params["raise"])
    return {"ok": True}


@awaiting_flow.step
async def awaiting_step(ctx: StepContext) -> dict[str, Any]:
    if ctx.params.get("raise"):
        await _raise_in_thread(ctx.params["raise"])
    return {"ok": True}


FLOWS = [sync_flow, async_flow, awaiting_flow]


@dataclass(frozen=True)
class Mode:
    name: str
    pool: type
    flow: str | None = None  # None: a plain handler
    handler: Callable[[Task], Any] | None = None
    threaded_runner: bool = False  # the flow runner as a sync handler (thread pool)


MODES = [
    Mode("handler-sync", HandlerPool, handler=sync_handler),
    Mode("handler-async", AsyncHandlerPool, handler=async_handler),
    Mode("handler-awaited", AsyncHandlerPool, handler=awaiting_handler),
    Mode("step-sync", AsyncHandlerPool, flow="raise_sync"),
    Mode("step-async", AsyncHandlerPool, flow="raise_async"),
    Mode("step-awaited", AsyncHandlerPool, flow="raise_awaited"),
    Mode("threaded-step-sync", HandlerPool, flow="raise_sync", threaded_runner=True),
    Mode("threaded-step-async", HandlerPool, flow="raise_async", threaded_runner=True),
]


@dataclass
class Results:
    """What one mode's worker did with every exception (filled once the run settles)."""

    dead: dict[str, dict[str, Any]] = field(default_factory=dict)  # handler modes: DLQ envelopes
    docs: dict[str, dict[str, Any] | None] = field(default_factory=dict)  # flow modes: execution states
    deliveries: dict[str, list[int]] = field(default_factory=dict)
    follower_done: bool = False
    dlq_len: int = 0
    pending: int = 0
    settled: str = ""


def _handler_run(url: str, client: redis.Redis, mode: Mode) -> Results:
    seen: dict[str, list[int]] = {}
    base = mode.handler
    assert base is not None

    def record(task: Task) -> Any:
        name = (task.body.get("params") or {}).get("raise") or "follower"
        seen.setdefault(name, []).append(task.delivery_count)
        return base(task)

    async def arecord(task: Task) -> None:
        await record(task)

    handler = arecord if mode.pool is AsyncHandlerPool else record
    s = settings(url, mode.name, max_deliveries=MAX_DELIVERIES, claim_min_idle_ms=200, reclaim_interval_s=0.1)
    res = Results(deliveries=seen)
    ids: dict[str, str] = {}
    try:
        with inproc_worker(s, handler) as w:  # type: ignore[arg-type]
            assert type(w.worker.pool) is mode.pool
            ids.update({_enqueue(client, {"raise": n}): n for n in EXCEPTIONS})
            _enqueue(client, {})
            wait_for(lambda: client.xlen(f"{QUEUE}:dlq") >= len(ids) and "follower" in seen, 25, "all dead-lettered")
            wait_for(lambda: _pending(client) == 0, 5, "nothing pending")
            res.follower_done = w.worker.counters.completed == 1
    except AssertionError as exc:  # each test reports what it needs from this
        res.settled = str(exc)
    for _, fields in client.xrange(f"{QUEUE}:dlq"):
        env = json.loads(fields[b"payload"])
        res.dead[ids[env["source_id"]]] = env
    res.dlq_len, res.pending = client.xlen(f"{QUEUE}:dlq"), _pending(client)
    return res


def _flow_run(url: str, client: redis.Redis, mode: Mode) -> Results:
    store_client = make_client(url, socket_timeout_s=5.0)
    store = ExecutionStore(store_client)
    runner = FlowRunner(FLOWS, store)
    queue = StreamQueue(store_client, stream=QUEUE, group=GROUP, consumer="p", dlq_key=f"{QUEUE}:dlq", dlq_max_len=10)
    flows = FlowClient(queue, store)
    handler = runner if mode.threaded_runner else runner.run_async
    s = settings(url, mode.name, eager_leases=True, max_deliveries=MAX_DELIVERIES, claim_min_idle_ms=200)
    res = Results()
    assert mode.flow is not None
    try:
        eids = {n: flows.start(mode.flow, {"raise": n}) for n in EXCEPTIONS}
        follower = flows.start(mode.flow, {})
        try:
            with inproc_worker(s, handler) as w:  # type: ignore[arg-type]
                assert type(w.worker.pool) is mode.pool
                wait_for(lambda: _terminal(store, [*eids.values(), follower]), 25, "every execution ended")
                wait_for(lambda: _pending(client) == 0, 5, "nothing pending")
        except AssertionError as exc:  # each test reports what it needs from this
            res.settled = str(exc)
        res.follower_done = (store.get(follower) or {}).get("status") == "completed"
        res.docs = {n: store.get(eid) for n, eid in eids.items()}
    finally:
        runner.close()
        store_client.close()
    res.dlq_len, res.pending = client.xlen(f"{QUEUE}:dlq"), _pending(client)
    return res


def _enqueue(client: redis.Redis, params: dict[str, Any]) -> str:
    mid = client.xadd(QUEUE, {"payload": json.dumps({"type": "start", "flow_id": "f", "params": params})})
    return mid.decode() if isinstance(mid, bytes) else str(mid)


def _pending(client: redis.Redis) -> int:
    try:
        return int(client.xpending(QUEUE, GROUP)["pending"])
    except redis.ResponseError:
        return 0


def _terminal(store: ExecutionStore, eids: list[str]) -> bool:
    return all((store.get(e) or {}).get("status") in ("completed", "error") for e in eids)


@pytest.fixture(scope="module", params=MODES, ids=[m.name for m in MODES])
def mode_run(request: pytest.FixtureRequest, redis_server: RedisServer) -> Iterator[tuple[Mode, Results]]:
    mode: Mode = request.param
    client = redis_server.client()
    client.flushall()
    try:
        run = _flow_run if mode.flow else _handler_run
        yield mode, run(redis_server.url, client, mode)
    finally:
        client.flushall()
        client.close()


@pytest.mark.parametrize("name", list(EXCEPTIONS))
def test_the_raise_is_a_failed_attempt(mode_run: tuple[Mode, Results], name: str) -> None:
    mode, res = mode_run
    if mode.flow is None:
        env = res.dead.get(name)
        assert env is not None, f"{name}: never dead-lettered ({res.settled or 'settled'}); deliveries {res.deliveries}"
        assert env["delivery_count"] == MAX_DELIVERIES and res.deliveries[name] == [1, 2]
        expected = _expected_type(name, mode.pool is AsyncHandlerPool)
        assert env["reason"].startswith(f"processing_failed:{expected}:"), env["reason"]
        return
    doc = res.docs.get(name)
    assert doc is not None and doc.get("status") == "error", f"{name}: {doc} ({res.settled or 'settled'})"
    error = doc["error"]
    assert error["attempts"] == MAX_ATTEMPTS and doc["attempt"] == MAX_ATTEMPTS, error
    outcomes = [h["outcome"] for h in doc["history"]]
    assert outcomes == ["failed", "error"], doc["history"]
    assert error["type"] == _expected_type(name, mode.flow != "raise_sync"), error
    assert name.rpartition(".")[2] in error["traceback"], error


def test_the_slot_came_back_and_nothing_else_was_charged(mode_run: tuple[Mode, Results]) -> None:
    mode, res = mode_run
    assert res.settled == "" and res.follower_done, f"{mode.name}: the plain task after them did not complete"
    assert res.pending == 0
    assert res.dlq_len == (len(EXCEPTIONS) if mode.flow is None else 0)


class _Unprintable(BaseException):
    def __str__(self) -> str:
        raise ValueError("no str for you")


@pytest.mark.parametrize("delivery", [1, MAX_DELIVERIES])
def test_an_exception_whose_str_raises_is_judged_all_the_same(delivery: int) -> None:
    """User code can raise an exception whose ``__str__`` raises: judging it must not (that
    would kill the handler thread, and the pool would shrink by one for good)."""
    outcome = judge(Task("1-0", {"type": "start", "flow_id": "f"}, delivery), _Unprintable(), MAX_DELIVERIES)
    if delivery < MAX_DELIVERIES:
        assert outcome == Outcome("1-0", RETRY)
    else:
        assert outcome.kind == DEAD and outcome.dead is not None
        assert outcome.dead.reason == "processing_failed:_Unprintable:<_Unprintable whose str() raised>"


def test_a_lost_lease_is_one_warning_line_and_the_task_stays_pending(caplog: pytest.LogCaptureFixture) -> None:
    """The demo on a loaded machine: a flow task whose lease lapsed during a Redis freeze raised
    LeaseLostError, logged as a handler's failure with a 260-line traceback. It is an expected
    condition: one warning line, the task left pending for the lease's next holder."""
    task = Task("1-0", {"type": "start", "flow_id": "f"}, 1)
    with caplog.at_level(logging.WARNING, logger="plaita.runtime.pool"):
        outcome = judge(task, LeaseLostError("lease of execution e lost"), MAX_DELIVERIES)
    assert outcome == Outcome("1-0", RETRY)
    [record] = caplog.records
    assert record.levelno == logging.WARNING and record.exc_info is None
    assert "lease of execution e lost" in record.getMessage() and "left pending" in record.getMessage()


def test_reproduction_4_a_generator_exit_step_on_a_real_worker(
    redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's reproduction as a process: ``plaita worker --flows M --concurrency 1``, a sync
    step raising GeneratorExit, then an ordinary execution. Before the fix the first was never
    settled (its lease renewed for ever), the second never ran, and SIGTERM waited out the drain."""
    monkeypatch.setenv("PLAITA_TEST_REDIS_URL", redis_url)
    client = make_client(redis_url, socket_timeout_s=5.0)
    store = ExecutionStore(client)
    queue = StreamQueue(client, stream=QUEUE, group=GROUP, consumer="p", dlq_key=f"{QUEUE}:dlq", dlq_max_len=10)
    flows = FlowClient(queue, store)
    args = ("--flows", __name__, "--concurrency", "1", "--max-deliveries", "3", "--drain-timeout-s", "30",
            "--claim-min-idle-ms", "2000", "--reclaim-interval-s", "1", "--lease-ttl-seconds", "5")  # fmt: skip
    try:
        with worker_proc(redis_url, tmp_path, "gx", *args) as w:
            w.wait_reading()
            bad = flows.start("raise_sync", {"raise": "GeneratorExit"})
            good = flows.start("raise_sync", {})
            assert flows.wait(good, 15)["status"] == "completed"
            doc = flows.wait(bad, 5)
            assert doc["status"] == "error" and doc["error"]["type"] == "GeneratorExit" and doc["attempt"] == 2
            wait_for(lambda: _pending(client) == 0, 5, "nothing pending")
            started = time.monotonic()
            assert w.terminate(timeout_s=10) == 0
            assert time.monotonic() - started < 5, "SIGTERM waited for a slot that never came back"
            assert "never retrieved" not in w.stderr()
        assert client.xlen(f"{QUEUE}:dlq") == 0
    finally:
        client.close()
