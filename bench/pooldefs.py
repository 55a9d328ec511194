"""Flows and a handler for ``bench/pool.py``, importable by subprocess workers
(``--flows bench.pooldefs``, ``--handler bench.pooldefs:nap``).

``bench-pool3``: three steps, each sleeping ``params.ms`` milliseconds (0: none); with
``params.crash`` the first step kills its process (``os._exit(3)``) on every attempt.
"""

from __future__ import annotations

import os
import time

from plaita.flows import Flow, RetryPolicy, StepContext
from plaita.tasks import Task

#: Failed attempts are retried at once: the crash benchmark measures the pool, not the backoff.
pool3 = Flow("bench-pool3", retry=RetryPolicy(max_attempts=3, base_s=0.01, cap_s=0.01))


def _nap(ms: object) -> None:
    if isinstance(ms, int | float) and ms > 0:
        time.sleep(ms / 1000)


@pool3.step
def one(ctx: StepContext) -> None:
    _nap(ctx.params.get("ms"))
    if ctx.params.get("crash"):
        os._exit(3)


@pool3.step
def two(ctx: StepContext) -> None:
    _nap(ctx.params.get("ms"))


@pool3.step
def three(ctx: StepContext) -> None:
    _nap(ctx.params.get("ms"))


def nap(task: Task) -> None:
    """A plain handler sleeping ``params.ms`` milliseconds."""
    params = task.body.get("params")
    _nap(params.get("ms") if isinstance(params, dict) else None)
