"""Execution metrics scraped from /metrics of a real flow worker process, and its in-flight count."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from plaita.flows.producer.client import FlowClient
from plaita.ops.status import read_status_file
from plaita.store.client import make_client
from plaita.store.streams.queue import StreamQueue
from tests.support.ops import QUEUE, REGISTRY_PREFIX, OpsWorker, ops_worker, wait_until

pytestmark = pytest.mark.redis

#: The suspended gauge is sampled with the queue gauges, every 5 s: allow two samples and slack.
SAMPLE_DEADLINE_S = 12.0
FLOW_ARGS = ("--flows", "tests.flows.flowdefs", "--concurrency", "4")


@pytest.fixture
def flows(redis_url: str) -> Iterator[FlowClient]:
    client = make_client(redis_url, socket_timeout_s=5.0)
    queue = StreamQueue(client, stream=QUEUE, group="plaita-workers", consumer="p", dlq_key="", dlq_max_len=1)
    yield FlowClient(queue)
    client.close()


def events(w: OpsWorker, flow: str) -> dict[str, float]:
    m = w.metrics()
    names = ("started", "suspended", "completed", "failed", "cancelled")
    return {e: m.get(("plaita_executions_total", (("event", e), ("flow", flow))), 0.0) for e in names}


def step_count(w: OpsWorker, flow: str, step: str, outcome: str) -> float:
    labels = (("flow", flow), ("outcome", outcome), ("step", step))
    return w.metrics().get(("plaita_step_duration_seconds_count", labels), 0.0)


def registry_entry(rclient: redis.Redis, w: OpsWorker) -> dict[str, object]:
    raw = rclient.get(f"{REGISTRY_PREFIX}{w.instance_id}")
    return json.loads(raw) if raw else {}


def test_execution_counters_and_step_histogram_move(flows: FlowClient, redis_url: str, tmp_path: Path) -> None:
    with ops_worker(redis_url, tmp_path, *FLOW_ARGS) as w:
        done = [flows.start("ledger3", {}) for _ in range(2)]
        failed = flows.start("flaky", {"fatal": True})
        for eid in [*done, failed]:
            flows.wait(eid, 15)
        assert events(w, "ledger3") == {"started": 2, "suspended": 0, "completed": 2, "failed": 0, "cancelled": 0}
        assert events(w, "flaky")["started"] == 1 and events(w, "flaky")["failed"] == 1
        for step in ("one", "two", "three"):
            assert step_count(w, "ledger3", step, "ok") == 2
        assert step_count(w, "flaky", "wobble", "failed") == 1
        # A duplicate start of a finished execution is a no-op: no second "started".
        flows.start("ledger3", {}, execution_id=done[0])
        wait_until(lambda: (read_status_file(w.status_file) or {}).get("counters", {}).get("completed") == 4, 10, "ack")
        assert events(w, "ledger3")["started"] == 2


def test_suspended_gauge_and_executions_in_flight(
    flows: FlowClient, rclient: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    """A suspended execution shows in the gauge; a running step shows in /metrics, status and registry."""
    with ops_worker(redis_url, tmp_path, *FLOW_ARGS) as w:
        waiting = flows.start("signup", {"name": "ann"})
        wait_until(lambda: (flows.get(waiting) or {}).get("status") == "suspended", 10, "signup suspended")
        wait_until(lambda: w.sample("plaita_executions_suspended") == 1, SAMPLE_DEADLINE_S, "suspended gauge 1")
        assert events(w, "signup")["suspended"] == 1
        assert step_count(w, "signup", "wait_email", "suspended") == 1

        busy = flows.start("patient", {"wait_s": 20})
        wait_until(lambda: rclient.get(f"plaita:test:sleeping:{busy}") == "linger", 10, "linger running")
        assert w.sample("plaita_executions_in_flight") == 1
        wait_until(lambda: (read_status_file(w.status_file) or {}).get("executions_in_flight") == 1, 5, "status")
        wait_until(lambda: registry_entry(rclient, w).get("executions_in_flight") == 1, 5, "registry entry")

        flows.cancel(busy)  # honoured at the next step boundary
        flows.cancel(waiting)  # suspended: cancelled at once
        for eid in (busy, waiting):
            assert flows.wait(eid, 15)["status"] == "cancelled"
        assert events(w, "patient")["cancelled"] == 1 and events(w, "signup")["cancelled"] == 1
        wait_until(lambda: w.sample("plaita_executions_in_flight") == 0, 5, "nothing in flight")
        wait_until(lambda: w.sample("plaita_executions_suspended") == 0, SAMPLE_DEADLINE_S, "suspended gauge 0")
        wait_until(lambda: registry_entry(rclient, w).get("executions_in_flight") == 0, 5, "registry back to 0")
