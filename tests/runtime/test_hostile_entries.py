"""Issue 10, reproductions 1-6: one hostile entry or one wrong-typed key never stops consumption.

Each test puts the hostile thing into a real private Redis next to a valid task and asserts
that the valid task still runs (the worker keeps consuming) and that the hostile entry ends in
the DLQ, or stays pending only where the key it needs is wrong. Tests whose fix lives in the
store or runtime are ``xfail(strict=True)`` with the fix they wait for as the reason.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
import redis

from plaita.fsm import State
from plaita.tasks import Task
from tests.support.workers import Recorder, RunningWorker, running_worker, wait_for

pytestmark = pytest.mark.redis

STREAM = "plaita:test:queue"
GROUP = "plaita-workers"
DLQ = f"{STREAM}:dlq"
LEASE = "plaita:execution:lease:"
#: How long a valid task behind a hostile one may take to run (the worker is idle otherwise).
CONSUME_S = 6.0


def raw_client(url: str) -> redis.Redis:
    """A client that sends and returns bytes exactly (hostile field names are not text)."""
    return redis.Redis.from_url(url, socket_timeout=5)


def add(rclient: redis.Redis, body: dict[str, Any] | str | bytes, **extra: Any) -> str:
    payload = body if isinstance(body, str | bytes) else json.dumps(body)
    return str(rclient.xadd(STREAM, {"payload": payload, "schema_version": "1", **extra}))


def good(n: int, **params: Any) -> dict[str, Any]:
    return {"type": "start", "flow_id": "f", "params": {"n": n, **params}}


def envelopes(rclient: redis.Redis) -> list[dict[str, Any]]:
    return [json.loads(f["payload"]) for _id, f in rclient.xrange(DLQ)]


def pending_ids(rclient: redis.Redis) -> list[str]:
    return [str(r["message_id"]) for r in rclient.xpending_range(STREAM, GROUP, min="-", max="+", count=100)]


def assert_still_consumes(rw: RunningWorker, rclient: redis.Redis, n: int = 99) -> str:
    """A valid task added now runs and is acked within CONSUME_S: the worker still consumes."""
    mid = add(rclient, good(n))
    wait_for(lambda: mid in rw.recorder.ids(), CONSUME_S, f"valid task {mid} to run behind the hostile one")
    wait_for(lambda: mid not in pending_ids(rclient), CONSUME_S, f"valid task {mid} acked")
    assert rw.alive
    return mid


def test_non_utf8_field_name_goes_to_dlq_and_consumption_continues(redis_url: str, rclient: redis.Redis) -> None:
    """Reproduction 1: a field named b'\\xff\\xfe' next to a valid payload."""
    raw = raw_client(redis_url)
    try:
        with running_worker(redis_url) as rw:
            bad = raw.xadd(STREAM, {b"\xff\xfe": b"x", b"payload": b'{"type":"start"}'}).decode()
            wait_for(lambda: rclient.xlen(DLQ) == 1, CONSUME_S, "the entry dead-lettered")
            assert_still_consumes(rw, rclient)
    finally:
        raw.close()
    [env] = envelopes(rclient)
    assert env["source_id"] == bad and "not UTF-8" in env["reason"]
    assert [{"base64": "//4="}, "x"] in env["fields"]  # the name kept exactly, not U+FFFD
    assert bad not in pending_ids(rclient)


def test_deep_json_goes_to_dlq_and_its_batch_runs(redis_url: str, rclient: redis.Redis) -> None:
    """Reproduction 2: 200000 nested arrays (400 KB, under the limit) read in one batch with valid tasks.

    RecursionError used to escape parse_entry: the valid tasks of the batch stayed in flight for good.
    """
    deep = '{"type":"start","x":' + "[" * 200_000 + "]" * 200_000 + "}"
    with running_worker(redis_url, concurrency=4, max_payload_bytes=1024 * 1024) as rw:
        pipe = rclient.pipeline(transaction=True)
        for i in range(2):
            pipe.xadd(STREAM, {"payload": json.dumps(good(i)), "schema_version": "1"})
        pipe.xadd(STREAM, {"payload": deep, "schema_version": "1"})
        pipe.xadd(STREAM, {"payload": json.dumps(good(2)), "schema_version": "1"})
        ids = [str(x) for x in pipe.execute()]
        wait_for(lambda: rclient.xlen(DLQ) == 1, CONSUME_S, "the deep entry dead-lettered")
        wait_for(lambda: pending_ids(rclient) == [], CONSUME_S, "the whole batch settled")
        assert sorted(rw.recorder.ids()) == sorted([ids[0], ids[1], ids[3]])
        assert_still_consumes(rw, rclient)
    [env] = envelopes(rclient)
    assert env["source_id"] == ids[2] and "nested too deep" in env["reason"]


@pytest.mark.parametrize(
    "params",
    [pytest.param({}, id="plain"), pytest.param({"bad": True}, id="body-a-handler-rejects")],
)
def test_lone_surrogate_goes_to_dlq_and_consumption_continues(
    params: dict[str, Any], redis_url: str, rclient: redis.Redis
) -> None:
    """Reproduction 3: ``"execution_id":"\\ud800"`` used to fail every lease/DLQ write (UnicodeEncodeError)."""
    body = '{"type":"start","execution_id":"\\ud800","params":' + json.dumps({"n": 1, **params}) + "}"
    with running_worker(redis_url, claim_min_idle_ms=0, reclaim_interval_s=0.05) as rw:
        bad = add(rclient, body)
        wait_for(lambda: rclient.xlen(DLQ) == 1, CONSUME_S, "the entry dead-lettered")
        assert_still_consumes(rw, rclient)
        assert bad not in rw.recorder.ids()  # rejected before any handler saw a body Redis cannot store
    [env] = envelopes(rclient)
    assert env["source_id"] == bad and "surrogate" in env["reason"]
    assert pending_ids(rclient) == []


def test_wrong_typed_lease_key_isolates_its_task(redis_url: str, rclient: redis.Redis) -> None:
    """Reproduction 4: ``HSET plaita:execution:lease:e2 a b``, then a task of execution e2."""
    rclient.hset(f"{LEASE}e2", "a", "b")
    with running_worker(redis_url, claim_min_idle_ms=0, reclaim_interval_s=0.05) as rw:
        stuck = add(rclient, {"type": "start", "execution_id": "e2", "params": {"n": 2}})
        wait_for(lambda: stuck in pending_ids(rclient) or rclient.xlen(DLQ) == 1, CONSUME_S, "e2 task read")
        assert_still_consumes(rw, rclient, n=3)
        assert_still_consumes(rw, rclient, n=4)  # and keeps consuming, not one lucky read
        assert rw.worker.entered(State.BACKOFF) == 0, rw.worker.transitions
    assert stuck not in rw.recorder.ids()


def test_garbage_lease_without_ttl_is_reported(
    redis_url: str, rclient: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """Reproduction 4b: ``SET plaita:execution:lease:e3 garbage`` (no TTL) holds e3's task forever."""
    caplog.set_level(logging.INFO, logger="plaita")
    rclient.set(f"{LEASE}e3", "garbage")
    with running_worker(redis_url, claim_min_idle_ms=0, reclaim_interval_s=0.05) as rw:
        add(rclient, {"type": "start", "execution_id": "e3", "params": {"n": 3}})
        assert_still_consumes(rw, rclient)

        def warned() -> bool:
            return any(r.levelno >= logging.WARNING and f"{LEASE}e3" in r.getMessage() for r in caplog.records)

        wait_for(warned, CONSUME_S, "a WARNING naming the never-expiring lease key")


def test_wrong_typed_dlq_key_keeps_bad_entry_pending_and_others_run(redis_url: str, rclient: redis.Redis) -> None:
    """Reproduction 5: the DLQ key holds a string; a malformed entry cannot be dead-lettered."""
    rclient.set(DLQ, "not a stream")
    # The production persistent backoff: a global failure then visibly stops consumption for 5 s.
    with running_worker(redis_url, persistent_backoff_s=5.0) as rw:
        bad = add(rclient, "{not json")
        wait_for(lambda: bad in pending_ids(rclient), CONSUME_S, "the bad entry read")
        wait_for(lambda: rw.worker.counters.bad_input == 1, CONSUME_S, "the bad entry parsed")
        assert_still_consumes(rw, rclient, n=5)
        assert_still_consumes(rw, rclient, n=6)
        assert rw.worker.entered(State.BACKOFF) == 0, rw.worker.transitions
    assert bad in pending_ids(rclient)  # never acked without its DLQ copy
    assert rclient.type(DLQ) == "string"


class DyingRecorder(Recorder):
    """Records like Recorder; ``params.die`` names a BaseException to raise from the handler."""

    def __call__(self, task: Task) -> None:
        super().__call__(task)
        die = task.body.get("params", {}).get("die")
        if die == "SystemExit":
            raise SystemExit(3)
        if die == "KeyboardInterrupt":
            raise KeyboardInterrupt


@pytest.mark.parametrize("die", ["SystemExit", "KeyboardInterrupt"])
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_handler_raising_base_exception_is_a_failure_not_a_dead_thread(
    die: str, redis_url: str, rclient: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """Reproduction 6: a handler raising SystemExit / KeyboardInterrupt on a one-thread worker."""
    caplog.set_level(logging.INFO, logger="plaita")
    with running_worker(redis_url, recorder=DyingRecorder(), concurrency=1) as rw:
        dying = add(rclient, good(1, die=die))
        wait_for(lambda: dying in rw.recorder.ids(), CONSUME_S, "the dying task to run")
        assert_still_consumes(rw, rclient)
        assert rw.worker.counters.failed >= 1
        assert rw.worker.in_flight == 0
    assert any(dying in r.getMessage() and r.levelno >= logging.ERROR for r in caplog.records)
