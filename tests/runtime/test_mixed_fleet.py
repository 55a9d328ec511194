"""Issue 18, reproduction 10: mixed fleets. A worker must say what it runs (no default handler),
publishes it in the registry, and a task meant for another live worker is left for that worker."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import redis

from tests.support.lease_workers import ROOT

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
