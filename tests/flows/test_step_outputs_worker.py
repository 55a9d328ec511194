"""Issue 18's reproductions 1 and 3 on a real worker process: a step whose checkpoint Redis would
refuse, or whose in-place state is not JSON, ends its execution in ``error`` after its retries;
nothing of it is written, the task is acked (no redelivery, no DLQ) and nothing blames Redis."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from plaita.flows.producer.client import FlowClient
from tests.flows import flowdefs
from tests.flows.support import ledgers
from tests.support.lease_workers import QUEUE, pending_count, wait_for, worker_proc

pytestmark = pytest.mark.redis

ARGS = ("--flows", "tests.flows.flowdefs", "--claim-min-idle-ms", "2000", "--reclaim-interval-s", "1",
        "--lease-ttl-seconds", "5", "--max-deliveries", "3", "--read-block-ms", "200")  # fmt: skip


def test_refused_checkpoints_end_in_error_with_nothing_written(
    redis_url: str, flows: FlowClient, tmp_path: Path
) -> None:
    r = flowdefs.client()
    with worker_proc(redis_url, tmp_path, "so", *ARGS) as w:
        w.wait_reading()
        half = "half-1"
        r.rpush(f"app:list:{half}", "x")
        flows.start("refused", execution_id=half)
        stamp = flows.start("stamp")
        docs = {eid: flows.wait(eid, 20) for eid in (half, stamp)}
        wait_for(lambda: pending_count(r) == 0, 10, "every task acked")  # type: ignore[arg-type]
        log = w.stderr()
        assert w.terminate() == 0
    assert docs[half]["status"] == "error" and docs[half]["error"]["type"] == "StagedWriteRefused"
    assert f"app:list:{half}" in docs[half]["error"]["message"]
    assert docs[stamp]["status"] == "error" and docs[stamp]["error"]["type"] == "NotSerializable"
    assert "'when'" in docs[stamp]["error"]["message"]
    # Each step ran its two attempts once: no redelivery re-ran it, nothing went to the DLQ.
    assert ledgers(half, ["stage_three"]) == [2] and ledgers(stamp, ["stamp_state"]) == [2]
    assert [r.exists(f"app:{k}:{half}") for k in ("good1", "good2")] == [0, 0]
    assert r.lrange(f"app:list:{half}", 0, -1) == ["x"]
    assert r.exists(f"{QUEUE}:dlq") == 0
    assert "Redis failed" not in log and "Traceback" not in log, log[-3000:]
    json.loads(r.get(f"plaita:execution:{half}"), parse_constant=lambda c: pytest.fail(c))  # type: ignore[arg-type]
