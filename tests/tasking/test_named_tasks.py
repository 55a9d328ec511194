"""Named tasks on a real server: routed by name, retries with backoff through the stream's delayed
set (moved by the worker's reclaim pass), results kept for a TTL, unknown names to the DLQ, async
tasks, the process pool, and the old bodies."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from plaita import (
    Settings,
    TaskClient,
    TaskFailed,
    TaskRegistry,
    TaskResultTimeout,
    UnknownTaskResult,
    enqueue,
    start_worker,
)
from plaita.cli.main import main
from plaita.errors import ConfigError
from plaita.ops.service import WorkerService
from plaita.store.streams.delayed import delayed_count, delayed_key
from plaita.store.streams.dlq import DeadLetterQueue
from plaita.store.streams.partitioned import open_queue
from plaita.tasking.registry import TaskDef, parse_call
from plaita.tasks import validate_body
from plaita.testing import TestClock
from tests.support import named_tasks
from tests.support.ops import wait_until

pytestmark = pytest.mark.redis

MODULE = "tests.support.named_tasks"
QUEUE = "test:named"
#: Deadlines for a loaded machine; a healthy run takes well under a second per wait.
WAIT_S = 30.0


def _settings(redis_url: str, **changes: Any) -> Settings:
    values: dict[str, Any] = {
        "redis_url": redis_url,
        "queue_name": QUEUE,
        "consumer_name": "named-c",
        "read_block_ms": 100,
        "registry_enabled": False,
        "concurrency": 2,
        # Retries and delayed tasks come back on the reclaim pass: a short one keeps the tests quick.
        "reclaim_interval_s": 0.1,
    }
    return Settings(**{**values, **changes})


@pytest.fixture
def worker(redis_url: str) -> Iterator[WorkerService]:
    named_tasks.CALLS.clear()
    with start_worker(_settings(redis_url), tasks=MODULE) as service:
        yield service


@pytest.fixture
def client(redis_url: str) -> Iterator[TaskClient]:
    with TaskClient.from_url(redis_url, queue_name=QUEUE) as tasks:
        yield tasks


def _dead_letters(redis_url: str) -> list[dict[str, Any]]:
    queue = open_queue(_settings(redis_url, consumer_name="reader"))
    try:
        return DeadLetterQueue(queue).oldest(100)
    finally:
        queue.close()


# -- routing -----------------------------------------------------------------------------------
def test_a_task_enqueued_by_name_or_function_runs_and_keeps_its_result(worker: Any, client: TaskClient) -> None:
    by_name = client.enqueue("add", [2, 3])
    by_function = client.enqueue(named_tasks.add, kwargs={"a": 10, "b": -4}, task_id="mine")
    assert by_function == "mine"
    assert client.result(by_name, timeout_s=WAIT_S) == 5
    assert client.result("mine", timeout_s=WAIT_S) == 6
    runs = worker.worker.runs["handler"]  # what `plaita workers` shows
    assert runs.startswith("tasks:") and "add" in runs.split(":", 1)[1].split(",")


def test_a_body_whose_type_is_a_task_name_runs_it_with_the_body_as_kwargs(
    worker: Any, client: TaskClient, redis_url: str
) -> None:
    """``{"type": "send_email", ...}`` used to go to the DLQ; a --tasks worker runs the task of that name."""
    client.queue.enqueue({"type": "send_email", "to": "ann@example.com", "subject": "hi", "task_id": "t-1"})
    wait_until(lambda: named_tasks.CALLS.get("send_email"), WAIT_S, "send_email to run")
    assert named_tasks.CALLS["send_email"][0][1] == {"to": "ann@example.com", "subject": "hi"}
    assert wait_until(lambda: _result_or_none(client, "t-1"), WAIT_S, "its result") == {"sent_to": "ann@example.com"}
    assert _dead_letters(redis_url) == []


def _result_or_none(client: TaskClient, task_id: str) -> Any:
    try:
        return client.result(task_id)
    except (UnknownTaskResult, TaskResultTimeout):
        return None


def test_an_unknown_task_name_goes_to_the_dlq_saying_so(worker: Any, client: TaskClient, redis_url: str) -> None:
    unknown = client.enqueue("no_such_task", [1])
    client.queue.enqueue({"type": "no_such_type", "x": 1})
    with pytest.raises(TaskFailed, match="BadTaskError: no task named 'no_such_task'"):
        client.result(unknown, timeout_s=WAIT_S)  # its producer hears why at once
    dead = wait_until(
        lambda: len(_dead_letters(redis_url)) == 2 and _dead_letters(redis_url), WAIT_S, "two dead letters"
    )
    reasons = sorted(d["reason"] for d in dead)
    assert reasons[0].startswith("no task named 'no_such_task' in this worker's registry (it has: add, ")
    assert reasons[1].startswith("no task named 'no_such_type'")
    # A malformed named body is refused with its own reason.
    with pytest.raises(Exception, match="'args' must be a JSON array"):
        parse_call({"type": "task", "task": "add", "args": {"a": 1}}, "1-0")


# -- retries -----------------------------------------------------------------------------------
def test_a_failing_task_is_retried_with_backoff_then_dead_lettered_with_its_error(
    worker: Any, client: TaskClient, redis_url: str
) -> None:
    task_id = client.enqueue("always_fails", ["k1"])
    with pytest.raises(TaskFailed) as failed:
        client.result(task_id, timeout_s=WAIT_S)
    assert failed.value.error_type == "RuntimeError" and failed.value.message == "boom 3"
    times = [t for t, _ in named_tasks.CALLS["always_fails:k1"]]
    assert len(times) == 3  # the first attempt and retries=2
    # backoff_s=0.4, doubled: the waits are at least 0.4 and 0.8 s (jitter only adds).
    assert times[1] - times[0] >= 0.4 and times[2] - times[1] >= 0.8
    dead = wait_until(lambda: _dead_letters(redis_url), WAIT_S, "the dead letter")
    assert len(dead) == 1
    assert dead[0]["reason"] == "task 'always_fails' failed after 3 attempt(s): RuntimeError: boom 3"
    assert dead[0]["payload"]["attempt"] == 3 and dead[0]["payload"]["task_id"] == task_id


def test_a_retry_holds_no_worker_slot_while_it_waits(redis_url: str, client: TaskClient) -> None:
    """One slot: a task enqueued after a failed one runs during the failed one's backoff."""
    named_tasks.CALLS.clear()
    with start_worker(_settings(redis_url, concurrency=1), tasks=MODULE):
        failing = client.enqueue("always_fails", ["k2"])
        wait_until(lambda: named_tasks.CALLS.get("always_fails:k2"), WAIT_S, "the first attempt")
        other = client.enqueue("add", [1, 1])
        assert client.result(other, timeout_s=WAIT_S) == 2
        # It finished before the failing task's first retry was due (0.4 s after its first attempt).
        assert len(named_tasks.CALLS["always_fails:k2"]) == 1
        with pytest.raises(TaskFailed):
            client.result(failing, timeout_s=WAIT_S)


def test_a_retry_waits_in_the_delayed_set_until_due_on_the_test_clock(redis_url: str, rclient: redis.Redis) -> None:
    """The retry's due time is read on plaita's clock: an hour's backoff passes at once when the
    test clock moves, and the worker's next reclaim pass puts the retry back on the stream."""
    named_tasks.CALLS.clear()
    with (
        TestClock() as clock,
        start_worker(_settings(redis_url), tasks=MODULE),
        TaskClient.from_url(redis_url, queue_name=QUEUE) as client,
    ):
        task_id = client.enqueue("fails_then_waits_an_hour", ["tc"])
        wait_until(lambda: delayed_count(rclient, [QUEUE]) == 1, WAIT_S, "the retry in the delayed set")
        [(_, due_ms)] = rclient.zrange(delayed_key(QUEUE), 0, -1, withscores=True)
        assert due_ms >= (clock() + 3500) * 1000  # an hour ahead (the clock has not moved)
        assert len(named_tasks.CALLS["fails_then_waits_an_hour:tc"]) == 1
        clock.advance(3600 * 1.3)  # past its backoff, jitter (up to 25 %) included
        assert client.result(task_id, timeout_s=WAIT_S) == "ok on attempt 2"
        assert delayed_count(rclient, [QUEUE]) == 0


def test_a_flaky_task_succeeds_on_its_retry_and_bad_input_is_not_retried(
    worker: Any, client: TaskClient, redis_url: str
) -> None:
    assert client.result(client.enqueue("fails_once", ["k"]), timeout_s=WAIT_S) == "ok on attempt 2"
    refused = client.enqueue("refuses", [7])
    with pytest.raises(TaskFailed, match="BadTaskError: cannot use 7"):
        client.result(refused, timeout_s=WAIT_S)
    dead = wait_until(lambda: _dead_letters(redis_url), WAIT_S, "the refused task's dead letter")
    assert [d["reason"] for d in dead] == ["cannot use 7"]


# -- results -----------------------------------------------------------------------------------
def test_a_result_expires_after_its_ttl_and_unknown_ids_say_so(
    worker: Any, client: TaskClient, rclient: redis.Redis
) -> None:
    task_id = client.enqueue("short_lived")
    assert client.result(task_id, timeout_s=WAIT_S) == "gone soon"
    assert 0 < rclient.pttl(f"{QUEUE}:result:{task_id}") <= 1000
    wait_until(lambda: _result_or_none(client, task_id) is None, WAIT_S, "the result to expire")
    with pytest.raises(UnknownTaskResult, match="no record of task 'never-enqueued'"):
        client.result("never-enqueued", timeout_s=5)
    # A task that keeps no result: its record goes once it ran.
    quiet = client.enqueue("fire_and_forget", [3])
    wait_until(lambda: named_tasks.CALLS.get("fire_and_forget"), WAIT_S, "fire_and_forget to run")
    wait_until(lambda: rclient.exists(f"{QUEUE}:result:{quiet}") == 0, WAIT_S, "its record to go")


def test_result_waits_at_most_its_timeout(worker: Any, client: TaskClient) -> None:
    task_id = client.enqueue("slow", [2.0])
    started_s = time.monotonic()
    with pytest.raises(TaskResultTimeout, match="has not finished after 0.3 s"):
        client.result(task_id, timeout_s=0.3)
    assert time.monotonic() - started_s < 1.5
    assert client.result(task_id, timeout_s=WAIT_S) == "slept"


def test_a_delayed_task_runs_no_earlier_than_its_delay(worker: Any, client: TaskClient) -> None:
    enqueued_s = time.monotonic()
    task_id = client.enqueue("add", [1, 2], delay_s=0.5)
    assert client.result(task_id, timeout_s=WAIT_S) == 3
    assert time.monotonic() - enqueued_s >= 0.5


# -- kinds of task and pools --------------------------------------------------------------------
def test_an_async_task_runs(worker: Any, client: TaskClient) -> None:
    ids = [client.enqueue("async_double", [n]) for n in range(5)]
    assert [client.result(i, timeout_s=WAIT_S) for i in ids] == [0, 2, 4, 6, 8]


def test_named_tasks_run_in_the_process_pool(redis_url: str) -> None:
    with start_worker(_settings(redis_url, pool="process"), tasks=MODULE):
        task_id = enqueue("whoami", redis_url=redis_url, queue_name=QUEUE)
        with TaskClient.from_url(redis_url, queue_name=QUEUE) as client:
            child_pid = client.result(task_id, timeout_s=60)
            assert isinstance(child_pid, int) and child_pid != os.getpid()
            assert client.result(client.enqueue("async_double", [21]), timeout_s=WAIT_S) == 42
            # Its first attempt fails in a child; the retry runs in a child too (the same one, or
            # the other, whose count starts anew: either way it is not this process's count).
            retried = client.result(client.enqueue("fails_once", ["in-child"]), timeout_s=WAIT_S)
            assert retried in ("ok on attempt 1", "ok on attempt 2") and "fails_once:in-child" not in named_tasks.CALLS


# -- the old bodies, and configuration ---------------------------------------------------------
def test_a_handler_worker_still_dead_letters_a_body_of_another_type() -> None:
    """Only a --tasks worker reads a ``type`` as a task name; every other worker is unchanged."""
    body = {"type": "send_email", "to": "x"}
    with pytest.raises(Exception, match="unknown task type 'send_email'"):
        validate_body(body)
    assert validate_body(body, named=True) is body
    with pytest.raises(Exception, match="'execution_id' must be a non-empty string"):
        validate_body({"type": "send_email", "execution_id": 5}, named=True)
    with pytest.raises(Exception, match="resume task has no 'execution_id'"):
        validate_body({"type": "resume"}, named=True)
    start = {"type": "start", "flow_id": "f", "params": {}}
    assert validate_body(start) is start and validate_body(start, named=True) is start


def test_plaita_worker_tasks_refuses_a_module_without_a_registry(
    redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["worker", "--redis-url", redis_url, "--tasks", "tests.support.no_tasks"])
    err = capsys.readouterr().err
    assert code == 2
    assert "--tasks 'tests.support.no_tasks': the module has no plaita.TaskRegistry" in err
    assert main(["worker", "--redis-url", redis_url, "--tasks", MODULE, "--handler", "x:y"]) == 2
    assert "--tasks cannot be combined with --handler" in capsys.readouterr().err


def test_registry_refuses_reserved_and_duplicate_names_and_enqueue_refuses_non_json(client: TaskClient) -> None:
    registry = TaskRegistry()
    with pytest.raises(ConfigError, match="'start' cannot name a task"):
        registry.task(name="start")(named_tasks.whoami)
    registry.add(named_tasks.tasks.get("add"))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="task 'add' is registered twice"):
        registry.add(TaskDef("add", named_tasks.whoami))
    with pytest.raises(ConfigError, match="its arguments must be JSON"):
        client.enqueue("add", [object()])
    with pytest.raises(ConfigError, match="is not a registered task"):
        client.enqueue(json.dumps)
    for bad in (-1.0, float("inf"), 11 * 365 * 24 * 3600.0):
        with pytest.raises(ConfigError, match="delay_s must be within"):
            client.enqueue("add", [1, 1], task_id="bad-delay", delay_s=bad)
    with pytest.raises(UnknownTaskResult):
        client.result("bad-delay")  # refused before anything was written
