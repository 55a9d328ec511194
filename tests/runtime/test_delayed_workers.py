"""Delayed plain tasks with two real worker processes, one killed (-9) while tasks come due: every
task is added to the stream exactly once (both workers move; the script is atomic) and runs."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis

from plaita.config import Settings
from plaita.store.acl import WORKER_ACL_RULES, setuser_command
from plaita.store.streams.delayed import MOVE_ACL, add_tasks, delayed_count
from plaita.store.streams.partitioned import open_queue
from tests.support.lease_workers import QUEUE, enqueue, wait_for, worker_proc
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.redis

TASKS = 300
GROUPS = 10
#: Moves often, so the test does not wait for a default reclaim interval.
FAST = ("--reclaim-interval-s", "0.2")
HANDLER = "tests.support.handlers:count_in_redis"


def _completed(client: redis.Redis) -> int:
    pipe = client.pipeline(transaction=False)
    for i in range(TASKS):
        pipe.exists(f"plaita:test:completed:e{i}")
    return sum(pipe.execute())


def test_due_tasks_are_added_once_and_run_though_a_worker_is_killed(redis_url: str, tmp_path: Path) -> None:
    client = redis.Redis.from_url(redis_url, socket_timeout=5)
    q = open_queue(Settings(redis_url=redis_url, queue_name=QUEUE, consumer_name="producer"), client=client)
    with (
        worker_proc(redis_url, tmp_path, "a", *FAST, handler=HANDLER) as a,
        worker_proc(redis_url, tmp_path, "b", *FAST, handler=HANDLER) as b,
    ):
        a.wait_reading(60)
        b.wait_reading(60)
        now_s = time.time()
        per = TASKS // GROUPS
        for g in range(GROUPS):  # due over two seconds, so moves of both workers overlap the kill
            bodies = [{"type": "start", "flow_id": "f", "execution_id": f"e{i}"} for i in range(g * per, (g + 1) * per)]
            add_tasks(q, bodies, at_s=now_s + 1.0 + 0.2 * g)
        assert client.xlen(QUEUE) == 0
        wait_for(lambda: _completed(client) >= 1, 60, "the first due task to run")
        a.kill9()
        wait_for(lambda: _completed(client) == TASKS, 90, "every delayed task to run")
        assert b.alive()
    assert delayed_count(client, [QUEUE]) == 0
    assert int(client.xinfo_stream(QUEUE)["entries-added"]) == TASKS  # each moved exactly once
    client.close()


def test_a_worker_whose_user_may_not_move_delayed_tasks_warns_once_and_works_on(
    redis_server: RedisServer, redis_url: str, tmp_path: Path
) -> None:
    """An ACL from before delayed tasks (no ZRANGEBYSCORE/ZREM/ZCARD): the reclaim pass's move is
    refused; the worker says so once and goes on consuming (no BACKOFF loop after an upgrade)."""
    old_rules = WORKER_ACL_RULES.replace(" " + MOVE_ACL, "")
    assert old_rules != WORKER_ACL_RULES
    admin = redis.Redis.from_url(redis_url, socket_timeout=5)
    # +incrby: the test handler's own counters (count_in_redis), not plaita's.
    admin.execute_command(*setuser_command("plaita-old-worker", "old-pw-0123456789", old_rules + " +incrby"))
    url = f"redis://plaita-old-worker:old-pw-0123456789@127.0.0.1:{redis_server.port}/0"
    q = open_queue(Settings(redis_url=redis_url, queue_name=QUEUE, consumer_name="producer"), client=admin)
    add_tasks(q, [{"type": "start", "flow_id": "f", "execution_id": "later"}], delay_s=0.01)
    try:
        with worker_proc(url, tmp_path, "old", *FAST, handler=HANDLER) as w:
            for eid in ("first", "second"):
                enqueue(admin, {"type": "start", "flow_id": "f", "execution_id": eid})
                wait_for(lambda e=eid: bool(admin.exists(f"plaita:test:completed:{e}")), 60, f"{eid} to run")
                wait_for(lambda: "delayed tasks of" in w.stderr(), 30, "the refusal to be logged")
            assert w.stderr().count("delayed tasks of") == 1 and "+zrangebyscore" in w.stderr()
            assert w.alive() and "BACKOFF" not in w.stderr()
        assert delayed_count(admin, [QUEUE]) == 1  # kept for a worker that may move it
    finally:
        admin.execute_command("ACL", "DELUSER", "plaita-old-worker")
        admin.close()
