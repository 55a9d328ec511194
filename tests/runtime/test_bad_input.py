"""Malformed entries and failing handlers go to the DLQ with a reason; the worker carries on.

Entries are XADDed raw with a real client; the worker is a real in-process Worker.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
import redis

from tests.support.workers import RunningWorker, running_worker, wait_for

pytestmark = pytest.mark.redis

STREAM = "plaita:test:queue"
GROUP = "plaita-workers"
DLQ = f"{STREAM}:dlq"
MAX_PAYLOAD_BYTES = 300

GOOD_BODY = {"type": "start", "flow_id": "f", "params": {"n": 99}}
OVERSIZED_BODY = {"type": "start", "flow_id": "f", "params": {"n": 1, "pad": "x" * MAX_PAYLOAD_BYTES}}


def add_raw(rclient: redis.Redis, fields: dict[str, str]) -> str:
    return str(rclient.xadd(STREAM, fields))  # type: ignore[arg-type]


def add_body(rclient: redis.Redis, body: dict[str, Any]) -> str:
    return add_raw(rclient, {"payload": json.dumps(body), "schema_version": "1"})


def dlq_envelopes(rclient: redis.Redis) -> list[dict[str, Any]]:
    return [json.loads(fields["payload"]) for _id, fields in rclient.xrange(DLQ)]


def pending(rclient: redis.Redis) -> int:
    return int(rclient.xpending(STREAM, GROUP)["pending"])


def assert_gone_from_source(rclient: redis.Redis, message_id: str) -> None:
    """Acked (not pending) and deleted from the source stream."""
    assert rclient.xrange(STREAM, message_id, message_id) == []
    assert rclient.xpending_range(STREAM, GROUP, min=message_id, max=message_id, count=1) == []


def run_good_task(rw: RunningWorker, rclient: redis.Redis) -> str:
    """The worker still consumes: a valid task runs exactly once and is acked."""
    good = add_body(rclient, GOOD_BODY)
    rw.recorder.wait_count(1)
    wait_for(lambda: pending(rclient) == 0 and rclient.xlen(STREAM) == 0, 5.0, "good task acked")
    assert rw.recorder.ids() == [good]
    assert rw.alive
    return good


MALFORMED = [
    pytest.param({"body": "{}", "schema_version": "1"}, "no 'payload' field", None, id="no-payload-field"),
    pytest.param({"payload": "{not json", "schema_version": "1"}, "not valid JSON", "{not json", id="not-json"),
    pytest.param({"payload": "[1, 2]"}, "not a JSON object (got list)", "[1, 2]", id="json-array"),
    pytest.param({"payload": '"x"'}, "not a JSON object (got str)", '"x"', id="json-string"),
    pytest.param({"payload": '{"flow_id": "f"}'}, "no 'type' field", '{"flow_id": "f"}', id="missing-type"),
    pytest.param(
        {"payload": '{"type": "explode"}'}, "unknown task type 'explode'", '{"type": "explode"}', id="unknown-type"
    ),
    pytest.param(
        {"payload": '{"type": "resume"}'},
        "resume task has no 'execution_id'",
        '{"type": "resume"}',
        id="resume-without-execution-id",
    ),
    pytest.param(
        {"payload": '{"type": "start", "execution_id": 12}'},
        "'execution_id' must be a non-empty string",
        '{"type": "start", "execution_id": 12}',
        id="numeric-execution-id",
    ),
    pytest.param(
        {"payload": json.dumps(GOOD_BODY), "schema_version": "2"},
        "unsupported schema_version=2",
        json.dumps(GOOD_BODY),
        id="schema-version-2",
    ),
    pytest.param(
        {"payload": json.dumps(OVERSIZED_BODY), "schema_version": "1"},
        f"over the {MAX_PAYLOAD_BYTES}-byte limit",
        json.dumps(OVERSIZED_BODY),
        id="oversized",
    ),
]


class TestMalformedEntries:
    """Each kind of malformed entry: one DLQ entry with the reason, source acked and deleted."""

    @pytest.mark.parametrize(("fields", "reason", "payload"), MALFORMED)
    def test_malformed_entry_dead_lettered(
        self, fields: dict[str, str], reason: str, payload: str | None, redis_url: str, rclient: redis.Redis
    ) -> None:
        """The entry lands in <stream>:dlq exactly once with its reason and original payload."""
        with running_worker(redis_url, max_payload_bytes=MAX_PAYLOAD_BYTES) as rw:
            bad = add_raw(rclient, fields)
            wait_for(lambda: rclient.xlen(DLQ) == 1 and pending(rclient) == 0, 5.0, "the entry dead-lettered")
            assert_gone_from_source(rclient, bad)
            run_good_task(rw, rclient)
            counters = rw.worker.counters
            assert (counters.bad_input, counters.dead_lettered, counters.completed) == (1, 1, 1)
        [envelope] = dlq_envelopes(rclient)
        assert reason in envelope["reason"]
        assert envelope["source_id"] == bad
        assert envelope["source_stream"] == STREAM
        assert envelope["delivery_count"] == 1
        assert envelope["payload"] == payload

    def test_garbled_schema_version_is_read_as_v1(
        self, redis_url: str, rclient: redis.Redis, caplog: pytest.LogCaptureFixture
    ) -> None:
        """schema_version 'abc' is read as 1 (compatible with the original worker): the task runs."""
        caplog.set_level(logging.WARNING, logger="plaita")
        with running_worker(redis_url) as rw:
            mid = add_raw(rclient, {"payload": json.dumps(GOOD_BODY), "schema_version": "abc"})
            rw.recorder.wait_count(1)
            wait_for(lambda: pending(rclient) == 0 and rclient.xlen(STREAM) == 0, 5.0, "task acked")
        assert rw.recorder.ids() == [mid]
        assert rclient.xlen(DLQ) == 0
        assert rw.worker.counters.bad_input == 0
        assert any("unreadable schema_version" in r.getMessage() for r in caplog.records)

    def test_dlq_is_trimmed_to_its_max_length(self, redis_url: str, rclient: redis.Redis) -> None:
        """Five malformed entries with dlq_max_len=3 leave exactly the newest three in the DLQ."""
        with running_worker(redis_url, dlq_max_len=3) as rw:
            bad = [add_raw(rclient, {"payload": f"garbage {i}"}) for i in range(5)]
            wait_for(lambda: rw.worker.counters.bad_input == 5 and pending(rclient) == 0, 5.0, "all dead-lettered")
            wait_for(lambda: rclient.xlen(STREAM) == 0, 5.0, "sources deleted")
            run_good_task(rw, rclient)
        assert rclient.xlen(DLQ) == 3
        assert [e["source_id"] for e in dlq_envelopes(rclient)] == bad[2:]
        assert rw.worker.counters.dead_lettered == 5


class TestFailingHandlers:
    """Handler verdicts: BadTaskError dead-letters at once; repeated failures after max_deliveries."""

    def test_bad_task_error_dead_letters_at_once(self, redis_url: str, rclient: redis.Redis) -> None:
        """A handler raising BadTaskError runs once and its task goes to the DLQ with the reason."""
        body = {"type": "start", "flow_id": "f", "params": {"n": 5, "bad": True}}
        with running_worker(redis_url) as rw:
            mid = add_body(rclient, body)
            wait_for(lambda: rclient.xlen(DLQ) == 1 and pending(rclient) == 0, 5.0, "dead-lettered")
            assert_gone_from_source(rclient, mid)
            assert rw.recorder.ids() == [mid]
            rw.recorder.reset()
            run_good_task(rw, rclient)
            counters = rw.worker.counters
            assert (counters.bad_input, counters.dead_lettered, counters.failed, counters.completed) == (0, 1, 1, 1)
        [envelope] = dlq_envelopes(rclient)
        assert envelope["reason"] == "handler says bad input"
        assert envelope["source_id"] == mid
        assert envelope["delivery_count"] == 1
        assert envelope["payload"] == body

    def test_always_failing_task_runs_max_deliveries_times_then_dlq(self, redis_url: str, rclient: redis.Redis) -> None:
        """A handler that always raises RuntimeError runs exactly 3 times (deliveries 1, 2, 3), then DLQ."""
        body = {"type": "start", "flow_id": "f", "params": {"n": 6, "fail": True}}
        with running_worker(redis_url, max_deliveries=3, claim_min_idle_ms=0, reclaim_interval_s=0.05) as rw:
            mid = add_body(rclient, body)
            wait_for(lambda: rclient.xlen(DLQ) == 1 and pending(rclient) == 0, 10.0, "dead-lettered")
            assert_gone_from_source(rclient, mid)
            assert [(e.message_id, e.delivery_count) for e in rw.recorder.executions] == [(mid, 1), (mid, 2), (mid, 3)]
            rw.recorder.reset()
            run_good_task(rw, rclient)
            counters = rw.worker.counters
            assert (counters.failed, counters.dead_lettered, counters.completed) == (3, 1, 1)
        [envelope] = dlq_envelopes(rclient)
        assert envelope["reason"].startswith("processing_failed:RuntimeError")
        assert "boom 6" in envelope["reason"]
        assert envelope["source_id"] == mid
        assert envelope["delivery_count"] == 3
        assert envelope["payload"] == body
