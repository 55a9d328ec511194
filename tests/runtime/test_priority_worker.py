"""A real worker process with priority levels in use: its idle BLOCK covers every level's stream
(a level-9 task wakes it long before a 5 s BLOCK ends) and SIGTERM still cuts that read (< 1 s)."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
import redis

from plaita.store.keyspace import level_stream, levels_key
from tests.support.workers import wait_for, worker_process

pytestmark = pytest.mark.redis

STREAM = "plaita:test:queue"
STOP_S = 1.0


def test_an_idle_worker_with_levels_wakes_for_level_nine_and_stops_at_once(
    redis_url: str, rclient: redis.Redis, tmp_path: Path
) -> None:
    rclient.sadd(levels_key(STREAM), 9)  # level 9 in use before the worker starts
    with worker_process(redis_url, tmp_path, "--read-block-ms", "5000", name="prio") as wp:
        wp.wait_state("READING")
        wait_for(lambda: rclient.exists(level_stream(STREAM, 9)) == 1, 10, "the level's group made")
        body = {"type": "start", "flow_id": "f", "execution_id": "e9", "params": {}}
        added_at = time.monotonic()
        rclient.xadd(level_stream(STREAM, 9), {"payload": json.dumps(body), "schema_version": "1"})
        # Acked (XDEL) well within the 5 s BLOCK: the read in progress was on level 9's stream too.
        wait_for(lambda: rclient.xlen(level_stream(STREAM, 9)) == 0, 10, "the level-9 task taken")
        assert time.monotonic() - added_at < 3.0
        rc, elapsed_s = wp.signal_and_time(signal.SIGTERM)
        assert rc == 0, wp.stderr()
        assert elapsed_s < STOP_S, elapsed_s
