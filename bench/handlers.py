"""Bench-only handlers, importable by subprocess workers (PYTHONPATH=<repo root>)."""

from __future__ import annotations

import os
import time

from plaita.tasks import Task


def stamp(task: Task) -> None:
    """Append ``<monotonic seconds> <message id>`` to $PLAITA_BENCH_LOG (one O_APPEND write).

    ``time.monotonic()`` is CLOCK_MONOTONIC on Linux, shared by every process, so the bench
    can compare it with its own clock.
    """
    line = f"{time.monotonic():.6f} {task.message_id}\n"
    fd = os.open(os.environ["PLAITA_BENCH_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
