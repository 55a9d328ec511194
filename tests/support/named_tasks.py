"""Named tasks for the tests (``--tasks tests.support.named_tasks``): module-level, so they pickle
by their module path into ``--pool process`` children. Attempts are recorded in this process
(thread pool tests read them); a task that must be seen from a child returns what it saw."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from typing import Any

from plaita import BadTaskError, TaskRegistry

tasks = TaskRegistry()

#: Calls seen in this process: task name -> [(monotonic time, args or kwargs), ...].
CALLS: dict[str, list[tuple[float, Any]]] = {}
_LOCK = threading.Lock()


def _seen(name: str, what: Any) -> int:
    with _LOCK:
        CALLS.setdefault(name, []).append((time.monotonic(), what))
        return len(CALLS[name])


@tasks.task(result_ttl_s=60)
def add(a: int, b: int) -> int:
    return a + b


@tasks.task(result_ttl_s=60)
def send_email(to: str, subject: str = "") -> dict[str, Any]:
    _seen("send_email", {"to": to, "subject": subject})
    return {"sent_to": to}


@tasks.task(name="fire_and_forget")
def no_result(n: int) -> int:
    _seen("fire_and_forget", n)
    return n


@tasks.task(retries=2, backoff_s=0.4, result_ttl_s=60)
def always_fails(key: str) -> None:
    attempt = _seen(f"always_fails:{key}", key)
    raise RuntimeError(f"boom {attempt}")


@tasks.task(retries=3, backoff_s=0.05, result_ttl_s=60)
def fails_once(key: str) -> str:
    attempt = _seen(f"fails_once:{key}", key)
    if attempt == 1:
        raise ConnectionError("the first attempt fails")
    return f"ok on attempt {attempt}"


@tasks.task(retries=1, backoff_s=3600, backoff_max_s=3600, result_ttl_s=60)
def fails_then_waits_an_hour(key: str) -> str:
    attempt = _seen(f"fails_then_waits_an_hour:{key}", key)
    if attempt == 1:
        raise ConnectionError("the first attempt fails")
    return f"ok on attempt {attempt}"


@tasks.task(retries=5, result_ttl_s=60)
def refuses(x: Any) -> None:
    raise BadTaskError(f"cannot use {x!r}")


@tasks.task(result_ttl_s=60)
async def async_double(n: int) -> int:
    await asyncio.sleep(0.01)
    return n * 2


@tasks.task(result_ttl_s=60)
def whoami() -> int:
    return os.getpid()


@tasks.task(result_ttl_s=60)
def slow(seconds: float) -> str:
    time.sleep(seconds)
    return "slept"


@tasks.task(result_ttl_s=1)
def short_lived() -> str:
    return "gone soon"
