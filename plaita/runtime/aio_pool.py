"""Async handlers: one event loop on one thread runs at most ``concurrency`` coroutines.

The worker uses this pool instead of ``HandlerPool`` when its handler is an ``async def``
function (or a callable whose ``__call__`` is one): a thousand waiting coroutines cost one
thread, not a thousand. Same interface, same outcome rules (``judge``), same drain: tasks
not started yet wait in one queue that ``take_unstarted`` empties.

A handler (or the object of a bound-method handler) with a ``tasks_queued(tasks)`` method is
told, on the loop and before any of them starts, of every batch of tasks queued: the flow runner
sends their executions' creates ahead in one write. What it does there must not block the loop;
an exception it raises is logged and changes nothing for the tasks.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from plaita.runtime.outcomes import Done, Outcome
from plaita.runtime.pool import UNBOUNDED, AckSlots, Handler, PoolBase, judge, stream_order
from plaita.tasks import Task

logger = logging.getLogger(__name__)

#: Longest wait for the loop thread to exit after ``stop`` (it only has to leave run_forever).
_STOP_JOIN_S = 1.0


def is_async_handler(handler: object) -> bool:
    """True for an ``async def`` function or bound method, or an object whose ``__call__`` is one."""
    if inspect.iscoroutinefunction(handler):
        return True
    call = getattr(handler, "__call__", None)  # noqa: B004 - the method itself is inspected
    return call is not None and inspect.iscoroutinefunction(call)


class AsyncHandlerPool(PoolBase):
    """Runs tasks as coroutines on one event loop thread; reports finished tasks via ``on_done``.

    Tasks finishing in the same loop iteration are reported as one chunk (one settler hand-off
    for them all), the way the thread pool reports a chunk.
    """

    def __init__(
        self,
        handler: Handler,
        *,
        concurrency: int,
        max_deliveries: int,
        on_done: Callable[[list[Done]], None],
        slots: AckSlots = UNBOUNDED,
        window: int = 0,  # the thread pool's signature; a coroutine takes one slot at a time here
    ) -> None:
        self._handler = handler
        #: Told of every batch queued (see the module docstring), or None.
        self._on_queued: Callable[[list[Task]], object] | None = getattr(
            getattr(handler, "__self__", handler), "tasks_queued", None
        )
        #: One ack-window slot per coroutine started, back once its outcome is routed.
        self._slots = slots
        self._concurrency = concurrency
        self._max_deliveries = max_deliveries
        self._on_done = on_done
        self._lock = threading.Lock()
        self._waiting: collections.deque[Task] = collections.deque()
        self._running = 0
        self._finished: list[Done] = []
        self._loop = asyncio.new_event_loop()
        # asyncio.to_thread (sync flow steps, blocking Redis calls) uses the default executor,
        # by default min(32, cores + 4) threads: sized to --concurrency, so none waits for one.
        self._offload = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="plaita-async-offload")
        self._loop.set_default_executor(self._offload)
        self._thread = threading.Thread(target=self._serve, name="plaita-async-handlers", daemon=True)
        # Strong references: the loop keeps only weak ones, and a collected task just vanishes.
        self._tasks: set[asyncio.Task[None]] = set()
        slots.on_room(lambda: self._call_soon(self._fill))  # a full window stopped _fill

    def start(self) -> None:
        self._thread.start()

    def submit(self, tasks: list[Task]) -> None:
        if not tasks:
            return
        with self._lock:
            self._waiting.extend(tasks)
        if self._on_queued is not None:
            self._call_soon(lambda: self._announce(tasks))  # before _fill: none started yet
        self._call_soon(self._fill)

    @property
    def busy(self) -> int:
        """Tasks queued or running."""
        with self._lock:
            return len(self._waiting) + self._running

    def take_unstarted(self) -> list[Task]:
        """Remove and return every task no coroutine has started, in stream order."""
        with self._lock:
            taken = list(self._waiting)
            self._waiting.clear()
        return sorted(taken, key=lambda t: stream_order(t.message_id))

    def stop(self) -> None:
        """Stop the loop; running coroutines are abandoned, not cancelled (the thread pool does
        not interrupt its handlers either, and the process is about to exit)."""
        self._call_soon(self._loop.stop)
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(_STOP_JOIN_S)
        self._offload.shutdown(wait=False)

    # -- on the loop thread ----------------------------------------------------------------
    def _call_soon(self, fn: Callable[[], object]) -> None:
        try:
            self._loop.call_soon_threadsafe(fn)
        except RuntimeError:  # the loop is closed: the worker is on its way out
            logger.debug("async handler loop closed; %s dropped", getattr(fn, "__name__", fn))

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_forever()
        finally:
            # With coroutines abandoned at a stop-now, closing would make their offloaded calls
            # fail noisily as they finish; the process is exiting, so leave the loop to it.
            if not self._tasks:
                self._loop.close()

    def _announce(self, tasks: list[Task]) -> None:
        """Tell ``tasks_queued`` of those of ``tasks`` still waiting (a task a finishing one's
        ``_fill`` started meanwhile, or a drain took back, is left out)."""
        assert self._on_queued is not None
        with self._lock:
            waiting = {id(t) for t in self._waiting}
        queued = [t for t in tasks if id(t) in waiting]
        if not queued:
            return
        try:
            self._on_queued(queued)
        except Exception:  # an optimisation only: the tasks run as they would without it
            logger.exception("tasks_queued of the handler failed for %d task(s)", len(queued))

    def _fill(self) -> None:
        """Start waiting tasks while fewer than ``concurrency`` run and the ack window has room."""
        while True:
            with self._lock:
                if not self._waiting or self._running >= self._concurrency:
                    return
            if not self._slots.take(1, block=False):
                return  # the window is full: on_room calls this again
            with self._lock:
                task = self._waiting.popleft() if self._waiting and self._running < self._concurrency else None
                if task is not None:
                    self._running += 1
            if task is None:  # taken back by a drain meanwhile
                self._slots.give_back(1)
                return
            job = self._loop.create_task(self._run(task), name=f"plaita-task-{task.message_id}")
            self._tasks.add(job)
            job.add_done_callback(self._tasks.discard)

    async def _run(self, task: Task) -> None:
        """The root of the task's asyncio task: whatever the handler raises is caught here, and
        only here. An exception resolving a future the handler awaits is *thrown* into this
        task, and a thrown ``GeneratorExit`` closes every coroutine up to the root, so a
        ``try`` in a helper coroutine would be closed with the rest and the task's slot lost.
        ``KeyboardInterrupt``/``SystemExit`` leaving the root would stop the loop itself."""
        started = time.monotonic()
        outcome: Outcome | None
        try:
            result = self._handler(task)
            if inspect.isawaitable(result):
                await result
            outcome = None  # a bare success: the router builds its Outcome
        except BaseException as exc:  # noqa: B036 - see the docstring
            outcome = judge(task, exc, self._max_deliveries)
        finally:
            duration_s = time.monotonic() - started
            with self._lock:  # the slot comes back whatever happened above
                self._running -= 1
                self._note_duration(duration_s)
        if not self._finished:
            self._loop.call_soon(self._report)
        self._finished.append((task, outcome, duration_s))
        self._fill()

    def _report(self) -> None:
        done, self._finished = self._finished, []
        try:
            self._on_done(done)
        except Exception:  # the router guards its observers; this would be a plaita bug
            logger.exception("reporting %d finished task(s) failed", len(done))
        finally:
            self._slots.give_back(len(done))
