"""``plaita tasks enqueue | result`` against a real server and a --tasks worker."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from plaita import start_worker
from plaita.cli.dev import tasks_flags
from plaita.cli.main import main
from plaita.ops.service import WorkerService
from tests.support.ops import wait_until
from tests.tasking.test_named_tasks import MODULE, QUEUE, WAIT_S, _settings

pytestmark = pytest.mark.redis


@pytest.fixture
def worker(redis_url: str) -> Iterator[WorkerService]:
    with start_worker(_settings(redis_url), tasks=MODULE) as service:
        yield service


def _run(capsys: pytest.CaptureFixture[str], redis_url: str, *argv: str) -> tuple[int, str, str]:
    code = main(["tasks", *argv, "--redis-url", redis_url, "--queue-name", QUEUE])
    out, err = capsys.readouterr()
    return code, out, err


def test_enqueue_then_result_as_text_and_json(
    worker: WorkerService, redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _run(capsys, redis_url, "enqueue", "add", "--args", "[4, 5]", "--json")
    assert code == 0
    task_id = json.loads(out)["task_id"]
    code, out, _ = _run(capsys, redis_url, "result", task_id, "--timeout-s", str(WAIT_S), "--json")
    assert code == 0 and json.loads(out) == {"task_id": task_id, "state": "done", "value": 9}
    code, out, _ = _run(capsys, redis_url, "result", task_id)
    assert code == 0 and out == "9\n"
    code, out, _ = _run(capsys, redis_url, "enqueue", "send_email", "--kwargs", '{"to": "bo"}', "--task-id", "e1")
    assert code == 0 and out == "e1\n"
    code, out, _ = _run(capsys, redis_url, "result", "e1", "--timeout-s", str(WAIT_S))
    assert code == 0 and json.loads(out) == {"sent_to": "bo"}


def test_failed_unknown_and_bad_arguments_say_so(
    worker: WorkerService, redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _run(capsys, redis_url, "enqueue", "refuses", "--args", "[1]")
    task_id = out.strip()
    code, out, _ = _run(capsys, redis_url, "result", task_id, "--timeout-s", str(WAIT_S), "--json")
    assert code == 1 and json.loads(out)["state"] == "error" and "cannot use 1" in json.loads(out)["error"]
    code, _, err = _run(capsys, redis_url, "result", "nobody")
    assert code == 1 and err.startswith("plaita tasks: no record of task 'nobody'")
    code, _, err = _run(capsys, redis_url, "enqueue", "add", "--args", '{"a": 1}')
    assert code == 2 and "--args must be a JSON array" in err


def test_plaita_dev_tasks_runs_a_handler_or_a_modules_named_tasks() -> None:
    assert tasks_flags("myapp.handlers:handle") == ["--handler", "myapp.handlers:handle"]
    assert tasks_flags("myapp.jobs") == ["--tasks", "myapp.jobs"]


def _ran(capsys: pytest.CaptureFixture[str], redis_url: str, task_id: str) -> str | None:
    code, out, _ = _run(capsys, redis_url, "result", task_id, "--json")
    return out if code == 0 else None


def test_plaita_enqueue_takes_a_named_task_body_and_still_checks_every_body(
    worker: WorkerService, redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A body whose ``type`` names a task is for a --tasks worker: ``plaita enqueue`` writes it
    (now or delayed); a malformed one, and a start or resume body, are refused as before."""

    def enqueue(*argv: str) -> tuple[int, str]:
        code = main(["enqueue", *argv, "--redis-url", redis_url, "--queue-name", QUEUE])
        return code, capsys.readouterr().err

    assert enqueue('{"type": "send_email", "to": "now", "task_id": "cli-now"}') == (0, "")
    assert enqueue('{"type": "send_email", "to": "later", "task_id": "cli-later"}', "--delay-s", "0.2") == (0, "")
    for task_id, to in (("cli-now", "now"), ("cli-later", "later")):
        # No "queued" record (only TaskClient writes one): "unknown" until the worker ran it.
        ran = wait_until(lambda t=task_id: _ran(capsys, redis_url, t), WAIT_S, f"{task_id}'s result")
        assert json.loads(ran)["value"] == {"sent_to": to}
    for body, reason in (
        ('{"type": "task", "task": "add", "args": {"a": 1}}', "'args' must be a JSON array"),
        ('{"type": "send_email", "attempt": 0}', "'attempt' must be a positive integer"),
        ('{"type": "send_email", "execution_id": 5}', "'execution_id' must be a non-empty string"),
        ('{"type": "resume"}', "resume task has no 'execution_id'"),
        ('{"type": ""}', "unknown task type"),
        ('{"to": "x"}', "has no 'type' field"),
    ):
        code, err = enqueue(body)
        assert code == 2 and reason in err, (body, err)
