"""Handlers for tests, importable by subprocess workers (PYTHONPATH=<repo root>).

``record`` appends one line per execution to the file named by $PLAITA_TEST_LOG (O_APPEND
writes of a short line are atomic), so counts survive Redis faults. ``count_in_redis``
counts executions in Redis itself ($PLAITA_TEST_REDIS_URL), for exclusivity tests.
Body ``params``: ``sleep_s`` (cancel-aware), ``hold_file`` (wait, cancel-aware and at most 30 s,
until that file exists: a test releases the task when it has seen what it wanted while the task
ran), ``fail`` (raise RuntimeError), ``bad`` (BadTaskError), ``exit_process`` (``os._exit(3)``),
``crash`` (kill the process after ``crash_after_s``: ``tests.support.crashsteps.crash``).
"""

from __future__ import annotations

import os
from typing import Any

import redis

from plaita.errors import BadTaskError
from plaita.tasks import Task
from tests.support.crashsteps import crash

_clients: dict[str, redis.Redis] = {}


def _params(task: Task) -> dict[str, Any]:
    p = task.body.get("params")
    return p if isinstance(p, dict) else {}


def _behave(task: Task) -> None:
    params = _params(task)
    if params.get("exit_process"):
        os._exit(3)  # a handler that kills its own process, ack and all
    if params.get("crash"):
        task.cancelled.wait(float(params.get("crash_after_s", 0)))
        crash(str(params["crash"]))
    if params.get("sleep_s"):
        task.cancelled.wait(float(params["sleep_s"]))
    if params.get("hold_file"):
        for _ in range(3000):  # bounded: 30 s at most
            if os.path.exists(str(params["hold_file"])) or task.cancelled.wait(0.01):
                break
    if params.get("bad"):
        raise BadTaskError("handler says bad input")
    if params.get("fail"):
        raise RuntimeError(f"boom {params.get('n')}")


def record(task: Task) -> None:
    path = os.environ["PLAITA_TEST_LOG"]
    n = _params(task).get("n")
    line = f"start {task.message_id} {n} {task.delivery_count}\n"
    with open(path, "a", encoding="utf-8") as f:
        f.write(line)
    _behave(task)
    with open(path, "a", encoding="utf-8") as f:
        f.write(f"done {task.message_id} {n} {task.delivery_count}\n")


def count_in_redis(task: Task) -> None:
    url = os.environ["PLAITA_TEST_REDIS_URL"]
    client = _clients.get(url)
    if client is None:
        client = _clients[url] = redis.Redis.from_url(url, socket_timeout=5)
    client.incr(f"plaita:test:executions:{task.execution_id}")
    _behave(task)
    client.incr(f"plaita:test:completed:{task.execution_id}")


def read_log(path: str) -> list[tuple[str, str, str, int]]:
    """Parse a ``record`` log into (event, message_id, n, delivery) tuples."""
    out = []
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                parts = line.split()
                if len(parts) == 4:
                    out.append((parts[0], parts[1], parts[2], int(parts[3])))
    except FileNotFoundError:
        pass
    return out
