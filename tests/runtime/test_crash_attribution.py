"""A step that kills its worker process fails only itself (issue 30, item 1: the default pool).

Real worker processes under a supervisor restart loop (``tests.support.supervisor``) on a real
redis-server. A poison step (``os._exit(3)``, SIGKILL to itself, a segfault; sync and async) runs
among innocent executions at ``--concurrency 4``: every innocent completes, none is charged a
delivery or dead-lettered, and the poison ends ``error`` with the reason, dead-lettered with it,
within ``--max-crashes`` worker exits, with an ``execution_error`` alert.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from plaita.flows.producer.client import FlowClient
from tests.support.crashsteps import EXIT_STATUS, RUNS_KEY
from tests.support.handlers import read_log
from tests.support.supervisor import supervise
from tests.support.webhook import Webhook, webhook

pytestmark = [pytest.mark.redis, pytest.mark.timeout(180)]

QUEUE = "plaita:test:crash"
DLQ = f"{QUEUE}:dlq"
MAX_CRASHES = 3
INNOCENTS = 8
#: Worker flags: short reclaim timings, so a replacement under another name takes over quickly.
ARGS = (
    "--queue-name",
    QUEUE,
    "--concurrency",
    "4",
    "--max-crashes",
    str(MAX_CRASHES),
    "--read-block-ms",
    "100",
    "--lease-ttl-s",
    "1",
    "--claim-min-idle-ms",
    "3000",
    "--reclaim-interval-s",
    "0.2",
    "--no-registry",
)


@pytest.fixture
def flows(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[FlowClient]:
    monkeypatch.setenv("PLAITA_TEST_REDIS_URL", redis_url)
    with FlowClient.from_url(redis_url, queue_name=QUEUE, socket_timeout_s=5.0) as client:
        yield client


@pytest.fixture
def hook() -> Iterator[Webhook]:
    with webhook() as h:
        yield h


def _dead_letters(rclient: redis.Redis) -> list[dict[str, Any]]:
    return [json.loads(fields["payload"]) for _, fields in rclient.xrange(DLQ)]


def _start_batch(flows: FlowClient, flow_id: str, kind: str) -> tuple[list[str], str]:
    """Innocents around one poison execution (in the middle of the stream)."""
    half = INNOCENTS // 2
    innocents = [flows.start(flow_id, {"hold_s": 0.4}, execution_id=f"inn-{i}") for i in range(half)]
    poison = flows.start(flow_id, {"crash": kind, "crash_after_s": 0.15}, execution_id="poison")
    innocents += [flows.start(flow_id, {"hold_s": 0.4}, execution_id=f"inn-{i}") for i in range(half, INNOCENTS)]
    return innocents, poison


def _runs(rclient: redis.Redis) -> Counter[str]:
    """Step runs per execution id (``tests.support.crashsteps``)."""
    return Counter(line.split()[0] for line in rclient.lrange(RUNS_KEY, 0, -1))


def _settled(flows: FlowClient, innocents: list[str], poison: str) -> bool:
    docs = [flows.get(eid) or {} for eid in innocents]
    return all(d.get("status") == "completed" for d in docs) and (flows.get(poison) or {}).get("status") == "error"


@pytest.mark.parametrize("kind", sorted(EXIT_STATUS))
@pytest.mark.parametrize("flow_id", ["crash-sync", "crash-async"])
def test_a_poison_step_ends_error_and_every_innocent_completes(
    flows: FlowClient, rclient: redis.Redis, redis_url: str, tmp_path: Path, hook: Webhook, flow_id: str, kind: str
) -> None:
    innocents, poison = _start_batch(flows, flow_id, kind)
    args = (*ARGS, "--flows", "tests.support.crashsteps", "--alert-webhook", hook.url)
    seen = supervise(redis_url, tmp_path, args, lambda: _settled(flows, innocents, poison), timeout_s=120)
    assert seen.done, seen.log()
    # The poison alone killed the process, each time: exactly --max-crashes exits, its own status.
    assert seen.exits == [EXIT_STATUS[kind]] * MAX_CRASHES, seen.log()
    doc = flows.get(poison)
    assert doc is not None and doc["status"] == "error"
    assert doc["error"]["type"] == "WorkerCrashed"
    assert doc["error"]["message"].startswith(f"killed its worker process {MAX_CRASHES} times"), doc["error"]
    # One dead letter: the poison's, with the reason, never charged a delivery for the crashes.
    (letter,) = _dead_letters(rclient)
    assert letter["payload"]["execution_id"] == poison
    assert letter["reason"].startswith(f"killed its worker process {MAX_CRASHES} times (exit code or signal unknown")
    assert letter["delivery_count"] == 1
    hook.wait_for(2, 10.0)  # the execution's alert and the dead letter's, in either order
    assert [a["execution_id"] for a in hook.events("execution_error")] == [poison]
    assert [a["reason"] for a in hook.events("dead_letter")] == [letter["reason"]]
    # No strike is left against anyone: each innocent ran alone and lived, the poison was judged.
    assert rclient.keys("plaita:execution:crashes:*") == []
    # Only the first crash (nothing known yet) cut innocents short: after it they ran alone, before
    # the poison ran alone again, so none ran more than twice. The poison ran once per crash.
    runs = _runs(rclient)
    assert all(runs[eid] in (1, 2) for eid in innocents), runs
    assert runs[poison] == MAX_CRASHES, runs


def test_a_replacement_under_another_consumer_name_keeps_the_strikes(
    flows: FlowClient, rclient: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    """Each restart takes another consumer name: it reclaims the dead consumer's tasks (idle and
    unleased) and treats them as suspects; the strikes are per task, so the count goes on."""
    innocents, poison = _start_batch(flows, "crash-sync", "sigkill")
    args = (*ARGS, "--flows", "tests.support.crashsteps")
    seen = supervise(
        redis_url, tmp_path, args, lambda: _settled(flows, innocents, poison), names=("a:0", "b:0"), timeout_s=120
    )
    assert seen.done, seen.log()
    assert seen.exits == [EXIT_STATUS["sigkill"]] * MAX_CRASHES, seen.log()
    (letter,) = _dead_letters(rclient)
    assert (letter["payload"]["execution_id"], letter["delivery_count"]) == (poison, 1)


@pytest.mark.parametrize("kind", ["exit", "segv"])
def test_a_plain_handler_that_kills_its_process_is_dead_lettered_and_no_innocent_is_charged(
    rclient: redis.Redis, redis_url: str, tmp_path: Path, kind: str
) -> None:
    """A plain handler (no flows): every innocent's every run sees delivery count 1."""

    def add(params: dict[str, Any]) -> str:
        body = {"type": "start", "flow_id": "f", "params": params}
        return str(rclient.xadd(QUEUE, {"payload": json.dumps(body), "schema_version": "1"}))

    innocents = [add({"n": i, "sleep_s": 0.4}) for i in range(INNOCENTS // 2)]
    poison = add({"n": "poison", "crash": kind, "crash_after_s": 0.15})
    innocents += [add({"n": i, "sleep_s": 0.4}) for i in range(INNOCENTS // 2, INNOCENTS)]
    log = str(tmp_path / "worker.log")

    def settled() -> bool:
        finished = {m for event, m, _n, _d in read_log(log) if event == "done"}
        return finished >= set(innocents) and rclient.xlen(DLQ) == 1

    args = (*ARGS, "--handler", "tests.support.handlers:record")
    seen = supervise(redis_url, tmp_path, args, settled, timeout_s=120)
    assert seen.done, seen.log()
    assert seen.exits == [EXIT_STATUS[kind]] * MAX_CRASHES, seen.log()
    runs = [(m, d) for event, m, _n, d in read_log(log) if event == "start" and m in innocents]
    assert runs and all(d == 1 for _m, d in runs), runs
    (letter,) = _dead_letters(rclient)
    assert (letter["source_id"], letter["delivery_count"]) == (poison, 1)
    assert letter["reason"].startswith(f"killed its worker process {MAX_CRASHES} times")
    assert rclient.xlen(QUEUE) == 0


@pytest.mark.parametrize("max_crashes", [1, 3])
def test_a_poison_alone_in_flight_is_blamed_at_its_first_crash(
    flows: FlowClient, rclient: redis.Redis, redis_url: str, tmp_path: Path, max_crashes: int
) -> None:
    """At ``--concurrency 1`` the poison is the only task in flight when it kills the process: the
    restarted worker finds it alone in its pending list, the only candidate, so that first crash is
    a strike against it at once. The poison ends ``error`` after exactly ``--max-crashes`` exits
    (one with ``--max-crashes 1``); the innocents before and after it complete, each run once."""
    before = [flows.start("crash-sync", {"hold_s": 0.05}, execution_id=f"inn-{i}") for i in range(2)]
    poison = flows.start("crash-sync", {"crash": "exit", "crash_after_s": 0.3}, execution_id="poison")
    after = [flows.start("crash-sync", {"hold_s": 0.05}, execution_id=f"inn-{i}") for i in range(2, 4)]
    innocents = before + after
    args = list(ARGS)
    args[args.index("--concurrency") + 1] = "1"
    args[args.index("--max-crashes") + 1] = str(max_crashes)
    args += ["--prefetch", "0", "--flows", "tests.support.crashsteps"]
    seen = supervise(redis_url, tmp_path, args, lambda: _settled(flows, innocents, poison), timeout_s=120)
    assert seen.done, seen.log()
    assert seen.exits == [EXIT_STATUS["exit"]] * max_crashes, seen.log()
    doc = flows.get(poison)
    assert doc is not None and doc["error"]["type"] == "WorkerCrashed"
    assert doc["error"]["message"].startswith(f"killed its worker process {max_crashes} times"), doc["error"]
    (letter,) = _dead_letters(rclient)
    assert (letter["payload"]["execution_id"], letter["delivery_count"]) == (poison, 1)
    runs = _runs(rclient)
    assert all(runs[eid] == 1 for eid in innocents), runs
    assert runs[poison] == max_crashes, runs
    assert rclient.keys("plaita:execution:crashes:*") == []
