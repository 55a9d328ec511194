"""Plain tasks with priorities through ``TaskClient`` and a real worker: a priority task runs, its
retry waits in its level's delayed set and comes back on its level, bad priorities are refused."""

from __future__ import annotations

import json

import pytest
import redis

from plaita import TaskClient, start_worker
from plaita.cli.main import main
from plaita.errors import ConfigError
from plaita.store.keyspace import level_stream
from plaita.store.streams.delayed import delayed_count
from plaita.testing import TestClock
from tests.support import named_tasks
from tests.support.ops import plaita, wait_until
from tests.tasking.test_named_tasks import MODULE, QUEUE, WAIT_S, _settings

pytestmark = pytest.mark.redis


def test_a_priority_task_runs_and_its_retry_keeps_its_level(redis_url: str, rclient: redis.Redis) -> None:
    named_tasks.CALLS.clear()
    with (
        TestClock() as clock,
        start_worker(_settings(redis_url), tasks=MODULE),
        TaskClient.from_url(redis_url, queue_name=QUEUE) as client,
    ):
        assert client.result(client.enqueue("add", [2, 3], priority=9), timeout_s=WAIT_S) == 5
        task_id = client.enqueue("fails_then_waits_an_hour", ["prio"], priority=7)
        wait_until(lambda: delayed_count(rclient, [level_stream(QUEUE, 7)]) == 1, WAIT_S, "the retry on level 7")
        assert delayed_count(rclient, [QUEUE]) == 0
        clock.advance(3600 * 1.3)
        assert client.result(task_id, timeout_s=WAIT_S) == "ok on attempt 2"
        # The result is stored before the task is acked and deleted (a batch of acks a moment later).
        wait_until(
            lambda: rclient.xlen(level_stream(QUEUE, 7)) == 0 and rclient.xlen(level_stream(QUEUE, 9)) == 0,
            WAIT_S,
            "both level streams emptied by the acks",
        )


def test_a_bad_priority_is_refused_before_anything_is_written(redis_url: str, rclient: redis.Redis) -> None:
    with TaskClient.from_url(redis_url, queue_name=QUEUE) as client:
        for bad in (10, -1, 2.5):
            with pytest.raises(ConfigError, match="priority"):
                client.enqueue("add", [1, 2], priority=bad)  # type: ignore[arg-type]
    assert rclient.keys("*") == []
    with pytest.raises(SystemExit) as exit_:
        main(["tasks", "enqueue", "add", "--priority", "10", "--redis-url", redis_url, "--queue-name", QUEUE])
    assert exit_.value.code == 2


def test_plaita_enqueue_priority_puts_the_tasks_on_their_level(redis_url: str, rclient: redis.Redis) -> None:
    body = '{"type": "task", "task": "add", "args": [1, 2], "kwargs": {}, "task_id": "t1"}'
    code = main(["enqueue", body, "--priority", "4", "--redis-url", redis_url, "--queue-name", QUEUE])
    assert code == 0
    assert rclient.xlen(level_stream(QUEUE, 4)) == 1 and not rclient.exists(QUEUE)
    [(_, fields)] = rclient.xrange(level_stream(QUEUE, 4))
    assert json.loads(fields["payload"])["priority"] == 4  # its retries read their level here


def test_plaita_executions_start_priority_starts_on_its_level(redis_url: str, rclient: redis.Redis) -> None:
    head = ["executions", "--redis-url", redis_url, "--queue-name", QUEUE, "start", "f"]
    with pytest.raises(SystemExit) as exit_:
        main([*head, "--priority", "12"])
    assert exit_.value.code == 2
    assert main([*head, "--priority", "3", "--execution-id", "cli-p3"]) == 0
    [(_, fields)] = rclient.xrange(level_stream(QUEUE, 3))
    assert '"execution_id":"cli-p3"' in fields["payload"].replace(" ", "")


def test_plaita_status_shows_the_length_of_each_priority_level(redis_url: str) -> None:
    common = ["--redis-url", redis_url, "--queue-name", QUEUE]
    for level, n in ((0, 2), (9, 3)):
        for i in range(n):
            body = f'{{"type": "task", "task": "add", "args": [{i}, 1], "kwargs": {{}}, "task_id": "s{level}{i}"}}'
            assert main(["enqueue", body, "--priority", str(level), *common]) == 0
    done = plaita(redis_url, "status", "--json", queue=QUEUE)
    assert done.returncode == 0, done.stderr
    status = json.loads(done.stdout)
    assert status["length"] == 5 and status["levels"] == {"0": 2, "9": 3}
    done = plaita(redis_url, "status", queue=QUEUE)
    assert done.returncode == 0, done.stderr
    assert "length by priority: 9: 3, 0: 2" in [line.strip() for line in done.stdout.splitlines()]
