"""A handler that kills its own process (``os._exit``) is charged a delivery, so it cannot poison
worker after worker forever: at ``--max-deliveries`` the task reaches the DLQ."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis

from tests.support.handlers import read_log
from tests.support.workers import wait_for, worker_process

pytestmark = pytest.mark.redis

STREAM = "plaita:test:queue"


def test_handler_exiting_the_process_is_charged_a_delivery(
    redis_url: str, rclient: redis.Redis, tmp_path: Path
) -> None:
    body = {"type": "start", "flow_id": "f", "params": {"n": 1, "exit_process": True}}
    mid = rclient.xadd(STREAM, {"payload": json.dumps(body), "schema_version": "1"})
    args = ("--handler", "tests.support.handlers:record", "--max-deliveries", "2", "--read-block-ms", "100")
    for delivery in (1, 2):
        with worker_process(redis_url, tmp_path, *args) as w:  # same consumer name every time
            assert w.proc.wait(15) == 3, w.stderr()
        starts = [d for event, m, _n, d in read_log(str(tmp_path / "w.log")) if event == "start" and m == mid]
        assert starts[-1] == delivery, starts
    with worker_process(redis_url, tmp_path, *args) as w:
        wait_for(lambda: rclient.xlen(f"{STREAM}:dlq") == 1, 10.0, "the task in the DLQ")
        assert w.proc.poll() is None, "the third worker must not run the task again"
    (entry,) = rclient.xrange(f"{STREAM}:dlq")
    envelope = json.loads(entry[1]["payload"])
    assert (envelope["source_id"], envelope["reason"], envelope["delivery_count"]) == (mid, "max_deliveries", 3)
    assert len([e for e in read_log(str(tmp_path / "w.log")) if e[0] == "start"]) == 2
