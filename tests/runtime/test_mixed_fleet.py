"""Issue 18, reproduction 10: mixed fleets. A worker must say what it runs (no default handler),
publishes it in the registry, and a task meant for another live worker is left for that worker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from plaita.flows.producer.client import FlowClient
from plaita.flows.runner.handover import HANDOVER_LIMIT
from plaita.store.client import make_client
from plaita.store.streams.queue import StreamQueue
from tests.support.lease_workers import QUEUE, ROOT, wait_for, worker_proc

pytestmark = pytest.mark.redis


def test_worker_without_handler_or_flows_exits_2_and_consumes_nothing(redis_url: str) -> None:
    """Reproduction 10: `plaita worker` with the defaults ran the `echo` handler and acked production work."""
    client = redis.Redis.from_url(redis_url, socket_timeout=5)
    client.xadd("plaita:flow:queue", {"payload": '{"type": "start", "flow_id": "order", "params": {}}'})
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLAITA_")}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run(
        [sys.executable, "-m", "plaita", "worker", "--redis-url", redis_url],
        cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--handler" in lines[0] and "--flows" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert client.xlen("plaita:flow:queue") == 1
    assert not client.exists("plaita:flow:queue") or not client.xinfo_groups("plaita:flow:queue")
    client.close()


def test_hand_back_is_bounded_when_the_worker_that_can_run_it_never_reads(
    redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The only worker loading the flow is registered and live but busy for good: the other one
    hands the start back at most HANDOVER_LIMIT times (no ping-pong forever), then leaves it
    pending like a failed delivery, so it reaches the DLQ after --max-deliveries with the reason."""
    monkeypatch.setenv("PLAITA_TEST_REDIS_URL", redis_url)
    args = ("--claim-min-idle-ms", "1000", "--reclaim-interval-s", "0.3", "--lease-ttl-s", "3",
            "--read-block-ms", "200", "--prefetch", "0", "--max-deliveries", "3")  # fmt: skip
    client = make_client(redis_url, socket_timeout_s=5.0)
    flows = FlowClient(
        StreamQueue(client, stream=QUEUE, group="plaita-workers", consumer="p", dlq_key="", dlq_max_len=10)
    )
    with worker_proc(redis_url, tmp_path, "busy-v2", "--flows", "tests.flows.fleet_v2", *args) as b:
        b.wait_reading()
        busy = flows.start("busy", {"s": 60})
        wait_for(lambda: client.get(f"plaita:test:busy:{busy}") is not None, 15, "the v2 worker busy for good")
        with worker_proc(redis_url, tmp_path, "idle-v1", "--flows", "tests.flows.fleet_v1", *args) as a:
            a.wait_reading()
            eid = flows.start("only_v2")
            wait_for(lambda: client.xlen(f"{QUEUE}:dlq") == 1, 40, "the start dead-lettered in the end")
            wait_for(lambda: a.counters().get("handed_back") == HANDOVER_LIMIT, 5, "the hand-backs counted")
            assert a.terminate() == 0
        b.kill9()
    [(_id, fields)] = client.xrange(f"{QUEUE}:dlq")
    letter = json.loads(fields.get(b"payload") or fields["payload"])  # type: ignore[index, union-attr]
    assert letter["payload"]["execution_id"] == eid and "flow 'only_v2' is not loaded here" in letter["reason"]
    log = a.stderr()
    assert f"handed back {HANDOVER_LIMIT} times" in log and "Traceback" not in log, log
    doc = flows.get(eid)  # never started by the wrong worker: still its producer's queued record
    assert doc is not None and doc["status"] == "queued" and doc["fingerprint"] is None and doc["history"] == []
    client.close()
