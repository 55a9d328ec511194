"""Bench-only handlers, importable by subprocess workers (PYTHONPATH=<repo root>)."""

from __future__ import annotations

import os
import time
from typing import Any

from plaita.tasks import Task


def _append(line: str) -> None:
    """One O_APPEND write: lines from concurrent handlers and processes never interleave."""
    fd = os.open(os.environ["PLAITA_BENCH_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def stamp(task: Task) -> None:
    """Append ``<monotonic seconds> <message id>`` to $PLAITA_BENCH_LOG.

    ``time.monotonic()`` is CLOCK_MONOTONIC on Linux, shared by every process, so the bench
    can compare it with its own clock.
    """
    _append(f"{time.monotonic():.6f} {task.message_id}\n")


def record(task: Task) -> None:
    """Log ``S`` at start and ``E`` at the end (``C`` when cancelled) to $PLAITA_BENCH_LOG.

    Line: ``kind monotonic wall message_id n delivery pid enqueued_wall``. Body ``params``:
    ``n`` (sequence number), ``t`` (time.time() at enqueue), ``sleep_s`` (cancel-aware sleep)
    and ``first_only`` (sleep on the first delivery only, so a re-execution is quick), or
    ``until_wall`` (sleep until that ``time.time()``: a reclaimed suspect keeps delivery 1).
    """
    params: Any = task.body.get("params")
    p: dict[str, Any] = params if isinstance(params, dict) else {}
    n = int(p.get("n", -1))
    t_enq = float(p.get("t", 0.0))
    tail = f"{task.message_id} {n} {task.delivery_count} {os.getpid()} {t_enq:.6f}\n"
    _append(f"S {time.monotonic():.6f} {time.time():.6f} {tail}")
    sleep_s = float(p.get("sleep_s", 0.0))
    if "until_wall" in p:  # sleep until a wall time: a run after it (another worker's) is quick
        sleep_s = max(0.0, float(p["until_wall"]) - time.time())
    if sleep_s > 0 and not (p.get("first_only") and task.delivery_count > 1) and task.cancelled.wait(sleep_s):
        _append(f"C {time.monotonic():.6f} {time.time():.6f} {tail}")
        return
    _append(f"E {time.monotonic():.6f} {time.time():.6f} {tail}")
