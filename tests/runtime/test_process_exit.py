"""A handler that kills its own process (``os._exit``) is charged a crash strike, not a delivery,
so it cannot poison worker after worker forever: the restarted worker runs it alone, and once it
killed the process ``--max-crashes`` times (the last one alone) it goes to the DLQ with the reason.
(tests/runtime/test_crash_attribution.py has the same among innocent tasks.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis

from tests.support.handlers import read_log
from tests.support.workers import wait_for, worker_process

pytestmark = pytest.mark.redis

STREAM = "plaita:test:queue"


def test_handler_exiting_the_process_is_charged_a_crash_not_a_delivery(
    redis_url: str, rclient: redis.Redis, tmp_path: Path
) -> None:
    body = {"type": "start", "flow_id": "f", "params": {"n": 1, "exit_process": True}}
    mid = rclient.xadd(STREAM, {"payload": json.dumps(body), "schema_version": "1"})
    args = ("--handler", "tests.support.handlers:record", "--max-crashes", "2", "--read-block-ms", "100")
    for _ in (1, 2):
        with worker_process(redis_url, tmp_path, *args) as w:  # same consumer name every time
            assert w.proc.wait(15) == 3, w.stderr()
        starts = [d for event, m, _n, d in read_log(str(tmp_path / "w.log")) if event == "start" and m == mid]
        assert starts[-1] == 1, starts  # a crash's re-read is no delivery
    with worker_process(redis_url, tmp_path, *args) as w:
        wait_for(lambda: rclient.xlen(f"{STREAM}:dlq") == 1, 10.0, "the task in the DLQ")
        assert w.proc.poll() is None, "the third worker must not run the task again"
    (entry,) = rclient.xrange(f"{STREAM}:dlq")
    envelope = json.loads(entry[1]["payload"])
    assert (envelope["source_id"], envelope["delivery_count"]) == (mid, 1)
    assert envelope["reason"].startswith("killed its worker process 2 times (exit code or signal unknown"), envelope
    assert len([e for e in read_log(str(tmp_path / "w.log")) if e[0] == "start"]) == 2
