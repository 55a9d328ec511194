"""Tell running steps about a cancel: the cancel key, the worker losing the lease, the
execution's deadline passing (``ctx.deadline_at``), or a step on a thread passing its soft time
limit (``add(..., limit_s=...)``: nothing can stop it there, a cooperative step can stop itself).

Steps shorter than ``poll_s`` cost nothing here (their checkpoint reports the cancel key);
longer ones get their flag within about ``poll_s`` from one MGET for all of them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from plaita.clock import wall_s
from plaita.tasks import Task

logger = logging.getLogger(__name__)

#: How often lease loss (``task.cancelled``), deadlines and soft limits reach running steps' flags.
_TICK_S = 0.1


class CancelWatch:
    """One daemon thread, started with the first step, polling for the steps that run now."""

    def __init__(self, cancel_flags: Callable[[Sequence[Task]], list[bool]], *, poll_s: float) -> None:
        #: Each task's cancel flag, in one MGET per tenant (``ExecutionIO.cancel_flags``).
        self._cancel_flags = cancel_flags
        self._poll_s = poll_s
        self._lock = threading.Lock()
        #: id(ctx) -> (ctx, task, since (monotonic), soft limit's end (monotonic) or None)
        self._active: dict[int, tuple[Any, Task, float, float | None]] = {}
        self._stop = threading.Event()
        #: Set while any step runs: an idle worker's watcher sleeps instead of ticking.
        self._busy = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, ctx: Any, task: Task, *, limit_s: float | None = None) -> None:
        """Watch ``ctx`` while its step runs; ``limit_s``: its soft time limit (set its flag past it)."""
        now = time.monotonic()
        with self._lock:
            self._active[id(ctx)] = (ctx, task, now, None if limit_s is None else now + limit_s)
            if not self._busy.is_set():  # set already but for a worker idle for a tick: no Event.set per step
                self._busy.set()
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(target=self._run, name="plaita-flow-cancel", daemon=True)
                self._thread.start()

    def remove(self, ctx: Any) -> None:
        # ``_busy`` stays set: the watcher clears it at its next tick if no step runs then.
        # Cleared here, a worker of short steps (none running between two) would clear and
        # set it again per step, an Event.set (lock, notify_all) each time.
        with self._lock:
            self._active.pop(id(ctx), None)

    def stop(self) -> None:
        self._stop.set()
        self._busy.set()
        with self._lock:
            thread = self._thread
        if thread is not None:
            thread.join(2.0)

    def _run(self) -> None:
        next_poll_s = time.monotonic() + self._poll_s
        while not self._stop.wait(_TICK_S):
            if not self._busy.is_set():
                self._busy.wait()  # no step runs: sleep until one starts (or stop)
                continue
            with self._lock:
                active = list(self._active.values())
                if not active:  # no step runs: sleep until one starts (``add`` sets it again)
                    self._busy.clear()
                    continue
            now_wall_s, now = wall_s(), time.monotonic()
            for ctx, task, _, limit_at in active:
                deadline_at = getattr(ctx, "deadline_at", None)
                if (
                    task.cancelled.is_set()
                    or (deadline_at is not None and now_wall_s >= deadline_at)
                    or (limit_at is not None and now >= limit_at)
                ):
                    ctx.cancel.set()
            if now < next_poll_s:
                continue
            next_poll_s = now + self._poll_s
            long_running = [(c, t) for c, t, since, _ in active if now - since >= self._poll_s and not c.cancelled]
            self._poll(long_running)

    def _poll(self, running: list[tuple[Any, Task]]) -> None:
        try:
            flags = self._cancel_flags([task for _, task in running])
        except Exception as exc:  # Redis down: the next checkpoint reports the cancel anyway
            logger.debug("cancel poll failed: %s: %s", type(exc).__name__, exc)
            return
        for (ctx, _), flag in zip(running, flags, strict=True):
            if flag:
                ctx.cancel.set()
