"""Schedules are a fleet fact, not a keeper's (issue 29, item 3), with real worker and keeper
processes on a private Redis: the keeper that holds a queue's lease starts every schedule some
worker or keeper of that queue recorded, whatever flows it loaded itself; a keeper on a second
queue of the same Redis acts on that queue; after Redis loses its data the schedules are recorded
again by the next keeper pass."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from tests.support.lease_workers import QUEUE, ROOT, keeper_proc, wait_for, worker_env, worker_proc

pytestmark = pytest.mark.redis

FLOWS = "tests.flows.scheduled"
FLOW = "every-second"
OTHER_QUEUE = "plaita:test:other"
KEEPER_ARGS = ("--interval-s", "0.2", "--keeper-lease-ttl-s", "2")


def lease_holders(client: redis.Redis) -> list[str]:
    """Every keeper lease on the server (whatever the key layout), by holder."""
    return [(client.get(k) or b"").decode() for k in client.scan_iter("plaita:keeper:lease*", count=1000)]


def started_ticks(client: redis.Redis) -> bool:
    return bool(client.hget(f"plaita:schedule:{FLOW}", "last_execution_id"))


def listed(url: str, queue: str = QUEUE) -> list[dict[str, object]]:
    cmd = [sys.executable, "-m", "plaita", "schedules", "list", "--json", "--redis-url", url, "--queue-name", queue]
    done = subprocess.run(cmd, cwd=str(ROOT), env=worker_env(url), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    rows: list[dict[str, object]] = json.loads(done.stdout)
    return rows


def test_the_keeper_of_a_worker_of_other_flows_starts_a_schedule_another_keeper_loads(
    redis_url: str, tmp_path: Path
) -> None:
    """Before: the worker's keeper held the one lease and the keeper loading the schedule stood by."""
    client = redis.Redis.from_url(redis_url, socket_timeout=5)
    worker_args = ("--flows", "tests.flows.flowdefs", "--keeper", "--keeper-lease-ttl-s", "2", "--read-block-ms", "200")
    try:
        with worker_proc(redis_url, tmp_path, "wk", *worker_args) as worker:
            worker.wait_reading()
            wait_for(lambda: any(f":{worker.proc.pid}:" in h for h in lease_holders(client)), 15, "the worker's keeper")
            with keeper_proc(redis_url, tmp_path, "kc", "--flows", FLOWS, *KEEPER_ARGS):
                wait_for(lambda: started_ticks(client), 20, "a tick of the keeper's schedule started")
            # The worker's keeper acted all along: the keeper process never took a lease.
            assert all(f":{worker.proc.pid}:" in h for h in lease_holders(client))
    finally:
        client.close()


def test_a_keeper_on_a_second_queue_starts_its_schedules(redis_url: str, tmp_path: Path) -> None:
    """Before: one lease per Redis, so the keeper of the other queue stood by for ever."""
    client = redis.Redis.from_url(redis_url, socket_timeout=5)
    try:
        with keeper_proc(redis_url, tmp_path, "ka", *KEEPER_ARGS):
            wait_for(lambda: bool(lease_holders(client)), 15, "the first queue's keeper")
            with keeper_proc(redis_url, tmp_path, "kb", "--queue-name", OTHER_QUEUE, "--flows", FLOWS, *KEEPER_ARGS):
                wait_for(lambda: int(client.xlen(OTHER_QUEUE)) > 0, 20, "a tick started on the second queue")
        assert int(client.xlen(QUEUE)) == 0  # nothing went to the first queue
        assert [r["flow"] for r in listed(redis_url, OTHER_QUEUE)] == [FLOW]
    finally:
        client.close()


def test_schedules_are_listed_again_one_pass_after_redis_lost_its_data(redis_url: str, tmp_path: Path) -> None:
    """Before: ``schedules list`` stayed empty until a keeper restarted."""
    client = redis.Redis.from_url(redis_url, socket_timeout=5)
    try:
        with keeper_proc(redis_url, tmp_path, "kd", "--flows", FLOWS, *KEEPER_ARGS):
            wait_for(lambda: started_ticks(client), 20, "the keeper's first ticks")
            assert [r["flow"] for r in listed(redis_url)] == [FLOW]
            client.flushall()
            wait_for(lambda: client.dbsize() > 0, 10, "the keeper's next pass")
            wait_for(lambda: [r["flow"] for r in listed(redis_url)] == [FLOW], 10, "the schedule listed again")
    finally:
        client.close()
