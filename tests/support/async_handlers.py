"""``async def`` handlers for tests, importable by subprocess workers (``--handler``).

``record_async`` appends ``start``/``done`` lines to $PLAITA_TEST_LOG like ``record`` in
tests.support.handlers, waiting ``params.sleep_s`` on the event loop (cancel-aware).
"""

from __future__ import annotations

import asyncio
import os
import time

from plaita.tasks import Task
from tests.support.handlers import _params

#: Poll period of the cancel flag while a coroutine waits.
CANCEL_POLL_S = 0.01


async def wait_cancelled(task: Task, timeout_s: float) -> bool:
    """Wait on the loop until ``task.cancelled`` or ``timeout_s``; True if cancelled."""
    deadline_s = time.monotonic() + timeout_s
    while not task.cancelled.is_set():
        left_s = deadline_s - time.monotonic()
        if left_s <= 0:
            return False
        await asyncio.sleep(min(CANCEL_POLL_S, left_s))
    return True


async def record_async(task: Task) -> None:
    path = os.environ["PLAITA_TEST_LOG"]
    params = _params(task)
    n = params.get("n")
    with open(path, "a", encoding="utf-8") as f:
        f.write(f"start {task.message_id} {n} {task.delivery_count}\n")
    await wait_cancelled(task, float(params.get("sleep_s", 0)))
    with open(path, "a", encoding="utf-8") as f:
        f.write(f"done {task.message_id} {n} {task.delivery_count}\n")
