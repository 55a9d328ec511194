"""``--pool process`` (issue 30, items 2 and 3): steps and handlers run in child processes, and a
child's death or a step past its time limit fails only that attempt; the worker never exits.

Real worker processes (``python -m plaita worker``, under ``tests.support.supervisor`` allowed ONE
start: any exit of the worker fails the test) on a real redis-server. Each fault kind (``os._exit(3)``,
SIGKILL of itself, a segfault, a step over its time limit) × sync/async step; the thread pool's
answer to the same crashes is ``tests/runtime/test_crash_attribution.py`` (the worker dies, crash
strikes), its soft time limit is tested here.
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from plaita.flows.producer.client import FlowClient
from tests.support.poolsteps import LIMIT_S, RUNS_KEY, SAW_CANCEL_KEY, SAW_LIMIT_KEY
from tests.support.redis_server import free_port
from tests.support.supervisor import Supervised, supervise
from tests.support.workers import wait_for

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]

QUEUE = "plaita:test:pool"
DLQ = f"{QUEUE}:dlq"
INNOCENTS = 4
ARGS = (
    "--queue-name",
    QUEUE,
    "--concurrency",
    "2",
    "--read-block-ms",
    "100",
    "--lease-ttl-s",
    "3",
    "--no-registry",
)
PROCESS = ("--pool", "process")
#: ``error.type`` and message start of an execution whose step failed for good, per fault kind.
FAILURES = {
    "exit": ("ChildProcessDied", "its child process died: exit code 3"),
    "sigkill": ("ChildProcessDied", "its child process died: killed by signal 9 (SIGKILL)"),
    "segv": ("ChildProcessDied", "its child process died: killed by signal 11 (SIGSEGV)"),
    "hang": ("StepTimeLimit", f"ran past its time limit of {LIMIT_S:g} s: its child process was killed"),
}


@pytest.fixture
def flows(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[FlowClient]:
    monkeypatch.setenv("PLAITA_TEST_REDIS_URL", redis_url)
    with FlowClient.from_url(redis_url, queue_name=QUEUE, socket_timeout_s=5.0) as client:
        yield client


def _runs(rclient: redis.Redis) -> list[tuple[str, int]]:
    """(execution or message id, pid) of every step or handler run, in order."""
    return [(name, int(pid)) for name, pid in (line.split() for line in rclient.lrange(RUNS_KEY, 0, -1))]


def _run_worker(redis_url: str, tmp_path: Path, args: tuple[str, ...], done: Any) -> Supervised:
    """One worker process until ``done()``: it must never exit by itself (one start only)."""
    seen = supervise(redis_url, tmp_path, (*ARGS, *args), done, max_starts=1, timeout_s=60)
    assert seen.done and seen.exits == [], seen.log()
    return seen


def _status(flows: FlowClient, eid: str) -> str | None:
    return (flows.get(eid) or {}).get("status")


@pytest.mark.parametrize("fault", sorted(FAILURES))
@pytest.mark.parametrize("flow_id", ["pool-sync", "pool-async"])
def test_a_fault_fails_only_its_own_attempts_and_the_worker_lives(
    flows: FlowClient, rclient: redis.Redis, redis_url: str, tmp_path: Path, flow_id: str, fault: str
) -> None:
    params = {"fault": fault, "fault_after_s": 0.1, "hang_s": 30}
    poison = flows.start(flow_id, params, execution_id="poison")
    innocents = [flows.start(flow_id, {"hold_s": 0.2}, execution_id=f"inn-{i}") for i in range(INNOCENTS)]

    def settled() -> bool:
        return _status(flows, poison) == "error" and all(_status(flows, e) == "completed" for e in innocents)

    began_s = time.monotonic()
    _run_worker(redis_url, tmp_path, (*PROCESS, "--flows", "tests.support.poolsteps"), settled)
    doc = flows.get(poison) or {}
    kind, message = FAILURES[fault]
    assert (doc["error"]["type"], doc["error"]["attempts"]) == (kind, 2), doc["error"]
    assert doc["error"]["message"].startswith(message), doc["error"]
    runs = _runs(rclient)
    worker_pids = {pid for name, pid in runs if name != poison}
    poison_pids = [pid for name, pid in runs if name == poison]
    # The step's retry policy ran it twice, each time in a child of its own (the first one was
    # replaced); every innocent ran exactly once: nobody beside the poison was cut short.
    assert len(poison_pids) == 2 and len(set(poison_pids)) == 2, runs
    assert Counter(name for name, _ in runs if name != poison) == dict.fromkeys(innocents, 1), runs
    assert os.getpid() not in worker_pids
    for pid in poison_pids:  # every child that ran the poison is gone
        assert not _alive(pid), pid
    if fault == "hang":  # killed at the limit, not after its 30 s
        assert time.monotonic() - began_s < 20
    assert rclient.xlen(DLQ) == 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return not Path(f"/proc/{pid}/stat").exists() or Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


@pytest.mark.parametrize("flow_id", ["pool-sync", "pool-async"])
def test_in_threads_the_time_limit_is_soft_the_result_is_discarded(
    flows: FlowClient, rclient: redis.Redis, redis_url: str, tmp_path: Path, flow_id: str
) -> None:
    """The thread pool cannot stop a step: it runs to its end, then the attempt fails."""
    slow = flows.start(flow_id, {"fault": "hang", "hang_s": LIMIT_S + 0.3}, execution_id="slow")
    fast = flows.start(flow_id, {"hold_s": 0.05}, execution_id="fast")

    def settled() -> bool:
        return _status(flows, slow) == "error" and _status(flows, fast) == "completed"

    _run_worker(redis_url, tmp_path, ("--flows", "tests.support.poolsteps"), settled)
    error = (flows.get(slow) or {})["error"]
    assert (error["type"], error["attempts"]) == ("StepTimeLimit", 2), error
    assert "the limit is soft" in error["message"] and "result was discarded" in error["message"]
    assert {pid for _, pid in _runs(rclient)} == {_runs(rclient)[0][1]}  # all in the worker process


@pytest.mark.parametrize("flow_id", ["pool-sync", "pool-async"])
def test_in_threads_a_step_past_its_soft_limit_sees_ctx_cancelled(
    flows: FlowClient, rclient: redis.Redis, redis_url: str, tmp_path: Path, flow_id: str
) -> None:
    """At its soft limit a step on a thread finds ``ctx.cancelled`` set, so a cooperative one stops
    (instead of holding its slot for its whole 30 s); the attempt still fails with ``StepTimeLimit``."""
    polite = flows.start(flow_id, {"fault": "polite", "hang_s": 30}, execution_id="polite")
    _run_worker(redis_url, tmp_path, ("--flows", "tests.support.poolsteps"), lambda: _status(flows, polite) == "error")
    error = (flows.get(polite) or {})["error"]
    assert (error["type"], error["attempts"]) == ("StepTimeLimit", 2), error
    saw = [line.split() for line in rclient.lrange(SAW_LIMIT_KEY, 0, -1)]
    assert [name for name, _ in saw] == [polite, polite], saw  # each attempt saw its flag
    # Set at the limit, not before it, and within the watcher's tick (0.1 s) and some slack after.
    # The limit counts from the step's registration with the watcher, a moment before the step's
    # own clock starts (a CI run saw 0.999 s): 50 ms of that, still far from "early".
    assert all(LIMIT_S - 0.05 <= float(took_s) < LIMIT_S + 5 for _, took_s in saw), saw


def test_a_step_in_a_child_logs_to_the_workers_stderr_at_its_level_and_format(
    flows: FlowClient, rclient: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    """A child is no fork of the worker: it gets the worker's root logging (INFO, ``LOG_FORMAT``)."""
    eid = flows.start("pool-sync", {"log": "hello-from-child"}, execution_id="talker")
    seen = _run_worker(
        redis_url,
        tmp_path,
        (*PROCESS, "--flows", "tests.support.poolsteps"),
        lambda: _status(flows, eid) == "completed",
    )
    ((_, child_pid),) = _runs(rclient)
    line = re.compile(
        r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO    tests\.support\.poolsteps: "
        rf"step of talker in process {child_pid} says hello-from-child$",
        re.MULTILINE,
    )
    (stderr,) = seen.stderr
    assert line.search(stderr), stderr[-3000:]
    assert "says a DEBUG line" not in stderr  # the worker's level, INFO, holds in the child too


def test_replaced_children_are_counted_by_reason_on_the_metrics_endpoint(
    flows: FlowClient, redis_url: str, tmp_path: Path
) -> None:
    """``plaita_pool_children_replaced_total{reason}``: a step that exits (2 attempts: 2 died), one
    past its time limit (2 time_limit), and ``--max-tasks-per-child 1`` recycling the child of each
    of 6 steps that returned (6 max_tasks; a child that died or was killed is no recycle)."""
    dies = flows.start("pool-sync", {"fault": "exit", "fault_after_s": 0}, execution_id="dies")
    hangs = flows.start("pool-sync", {"fault": "hang", "hang_s": 30}, execution_id="hangs")
    fine = [flows.start("pool-sync", {}, execution_id=f"fine-{i}") for i in range(6)]
    port = free_port()
    scraped: list[dict[str, float]] = []

    def settled() -> bool:
        if _status(flows, dies) != "error" or _status(flows, hangs) != "error":
            return False
        if not all(_status(flows, e) == "completed" for e in fine):
            return False
        scraped.append(_replaced(port))
        return True

    args = (*PROCESS, "--flows", "tests.support.poolsteps", "--max-tasks-per-child", "1")
    _run_worker(redis_url, tmp_path, (*args, "--metrics-host", "127.0.0.1", "--metrics-port", str(port)), settled)
    counts = scraped[-1]
    assert set(counts) == {"died", "time_limit", "cancelled", "max_tasks", "max_memory", "other"}, counts
    assert counts == {"died": 2, "time_limit": 2, "cancelled": 0, "max_tasks": 6, "max_memory": 0, "other": 0}


def _replaced(port: int) -> dict[str, float]:
    """``plaita_pool_children_replaced_total`` by reason, scraped from the worker's /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    found = re.findall(r'^plaita_pool_children_replaced_total\{reason="(\w+)"\} (\S+)$', text, re.MULTILINE)
    return {reason: float(n) for reason, n in found}


def test_the_context_crosses_the_process_boundary(
    flows: FlowClient, rclient: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    """State, goto, stage, publish, suspend, resume, spawn and children, sleep, results: as in threads."""
    eid = flows.start("pool-features", {"n": 21}, execution_id="feat")
    seen_events: list[Any] = []

    def settled() -> bool:
        doc = flows.get(eid) or {}
        if doc.get("status") == "suspended" and doc.get("step") == "third" and not seen_events:
            seen_events.append(flows.events(eid))
            flows.resume(eid, "event", {"go": True})
        return doc.get("status") == "completed"

    args = (*PROCESS, "--flows", "tests.support.poolsteps", "--keeper", "--keeper-lease-ttl-s", "1")
    _run_worker(redis_url, tmp_path, args, settled)
    doc = flows.get(eid) or {}
    results = doc["results"]
    assert results["third"] == {"resumed": 1, "state": 42, "sum": 3}
    assert results["last"]["first"] == results["first"]["pid"] != os.getpid()
    assert rclient.get("plaita:test:pool:staged") == "v" and rclient.get("plaita:test:pool:count") == "5"
    assert seen_events == [{"progress": 0.5}]


def test_a_cancel_kills_the_step_and_frees_its_slot(
    flows: FlowClient, rclient: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    """``pool-cancel`` has ``max_concurrent=1``: the next execution runs only once the slot is free."""
    deaf = flows.start("pool-cancel", {"hold_s": 30}, execution_id="deaf")
    polite = flows.start("pool-cancel", {"cooperative": True}, execution_id="polite")
    after = flows.start("pool-cancel", {"hold_s": 0}, execution_id="after")
    cancelled_s: dict[str, float] = {}

    def step(eid: str) -> bool:
        ran = any(name == eid for name, _ in _runs(rclient))
        if ran and _status(flows, eid) == "running" and eid not in cancelled_s:
            flows.cancel(eid)
            cancelled_s[eid] = time.monotonic()
        return _status(flows, eid) == "cancelled"

    def settled() -> bool:
        ended = [step(deaf), step(polite)]  # both every time: either may hold the slot first
        return all(ended) and _status(flows, after) == "completed"

    try:
        _run_worker(redis_url, tmp_path, (*PROCESS, "--flows", "tests.support.poolsteps"), settled)
    except AssertionError:
        docs = {e: flows.get(e) for e in (deaf, polite, after)}
        raise AssertionError(f"runs {_runs(rclient)}; cancelled {cancelled_s}; docs {docs}") from None
    pids = dict(_runs(rclient))
    assert not _alive(pids["deaf"])
    assert rclient.get(SAW_CANCEL_KEY) == polite  # the flag reached the child's step
    # Each ran once, the next only once the slot was free (the deaf one would hold it for 30 s).
    assert Counter(name for name, _ in _runs(rclient)) == {deaf: 1, polite: 1, after: 1}


@pytest.mark.parametrize("handler", ["handle", "handle_async"])
@pytest.mark.parametrize("fault", sorted(FAILURES))
def test_a_plain_handler_that_kills_its_child_is_a_failed_delivery(
    rclient: redis.Redis, redis_url: str, tmp_path: Path, handler: str, fault: str
) -> None:
    """Each crash (or a call past ``--step-time-limit-s``) is one failed delivery of that task only;
    at --max-deliveries it is dead-lettered with the reason; the innocents beside it are acked on
    their first delivery."""

    def add(params: dict[str, Any]) -> str:
        body = {"type": "start", "flow_id": "f", "params": params}
        return str(rclient.xadd(QUEUE, {"payload": json.dumps(body), "schema_version": "1"}))

    poison = add({"fault": fault, "hang_s": 30})
    innocents = [add({"hold_s": 0.1}) for _ in range(INNOCENTS)]

    def settled() -> bool:
        return rclient.xlen(DLQ) == 1 and not rclient.xpending(QUEUE, "plaita-workers")["pending"]

    args = (*PROCESS, "--handler", f"tests.support.poolsteps:{handler}", "--max-deliveries", "2")
    args += ("--step-time-limit-s", str(LIMIT_S), "--claim-min-idle-ms", "300", "--reclaim-interval-s", "0.1")
    _run_worker(redis_url, tmp_path, args, settled)
    ((_, letter),) = rclient.xrange(DLQ)
    envelope = json.loads(letter["payload"])
    assert envelope["source_id"] == poison and envelope["delivery_count"] == 2
    kind, message = FAILURES[fault]
    assert envelope["reason"].startswith(f"processing_failed:{kind}:{message}"), envelope["reason"]
    runs = _runs(rclient)
    assert Counter(name for name, _ in runs) == {poison: 2, **dict.fromkeys(innocents, 1)}, runs


def test_fast_tasks_share_round_trips_and_a_crash_among_them_charges_only_itself(
    rclient: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    """0 ms tasks go to children in batches (``run_batch``): the crash fails the task that ran, the
    tasks before it in its batch are done, those after it never started and run once elsewhere."""

    def add(params: dict[str, Any]) -> str:
        body = {"type": "start", "flow_id": "f", "params": params}
        return str(rclient.xadd(QUEUE, {"payload": json.dumps(body), "schema_version": "1"}))

    innocents = [add({}) for _ in range(150)]
    poison = add({"fault": "exit"})
    innocents += [add({}) for _ in range(150)]

    def settled() -> bool:
        return rclient.xlen(DLQ) == 1 and not rclient.xpending(QUEUE, "plaita-workers")["pending"]

    args = (*PROCESS, "--handler", "tests.support.poolsteps:handle", "--max-deliveries", "2")
    _run_worker(redis_url, tmp_path, (*args, "--claim-min-idle-ms", "300", "--reclaim-interval-s", "0.1"), settled)
    ((_, letter),) = rclient.xrange(DLQ)
    assert json.loads(letter["payload"])["source_id"] == poison
    runs = Counter(name for name, _ in _runs(rclient))
    assert runs == {poison: 2, **dict.fromkeys(innocents, 1)}


def test_children_are_recycled_between_tasks(
    flows: FlowClient, rclient: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    eids = [flows.start("pool-sync", {}, execution_id=f"r-{i}") for i in range(6)]

    def settled() -> bool:
        return all(_status(flows, e) == "completed" for e in eids)

    args = (*PROCESS, "--flows", "tests.support.poolsteps", "--max-tasks-per-child", "2")
    _run_worker(redis_url, tmp_path, args, settled)
    per_pid = Counter(pid for _, pid in _runs(rclient))
    assert len(per_pid) >= 3 and max(per_pid.values()) <= 2, per_pid


def test_a_child_over_its_memory_limit_is_replaced(
    flows: FlowClient, rclient: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    eids = [flows.start("pool-sync", {}, execution_id=f"m-{i}") for i in range(3)]

    def settled() -> bool:
        return all(_status(flows, e) == "completed" for e in eids)

    args = (*PROCESS, "--flows", "tests.support.poolsteps", "--concurrency", "1", "--max-memory-per-child-mb", "1")
    _run_worker(redis_url, tmp_path, args, settled)
    pids = [pid for _, pid in _runs(rclient)]
    assert len(pids) == 3 and len(set(pids)) == 3, pids  # every child is over 1 MiB: each ran one step
    wait_for(lambda: not any(_alive(p) for p in pids), 5.0, "the recycled children to exit")
