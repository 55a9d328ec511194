"""``--pool process``: a prefork pool of child processes, one pipe each, that run steps and handlers
so that whatever kills a process (``os._exit``, SIGKILL from the OOM killer, a segfault in a C
extension) kills only a child. The worker process alone talks to Redis, holds the leases, renews
and acks; a child's death fails the one attempt it ran and the pool replaces the child at once.

Children are started with ``forkserver`` where the platform has it (Linux, macOS), else ``spawn``:
never a plain ``fork`` of the worker, which has threads (a lock held by another thread at the fork
stays held in the child for ever). The fork server preloads the modules of the steps and handler,
so a replacement child is a fork of an already-imported process, not a fresh interpreter.

``concurrent.futures.ProcessPoolExecutor`` is not used: one dead child breaks that whole pool and
fails every future in it, innocent ones included.

``run`` blocks its calling thread for one job: it sends the job, forwards a cancel, answers the
child's live calls (``request``), kills the child past the time limit or a cancel's grace, and
returns what the job returned or raises what it raised.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import itertools
import logging
import multiprocessing
import pickle
import select
import threading
import time
from collections.abc import Sequence
from typing import Any

from plaita.errors import ChildProcessDied, StepCancelled, StepTimeLimit
from plaita.runtime.procbatch import BatchCancels, BatchCut, cut, fill_plain
from plaita.runtime.procchild import BATCH, CANCEL, DONE, EXIT, MANY, RUN, LogSetup, serve
from plaita.runtime.procwire import (
    REAP_S,
    ChildHandle,
    OnRequest,
    answer,
    describe_exit,
    readable,
    retire,
    send_quietly,
    start_method,
)
from plaita.tasks import CancelFlag

logger = logging.getLogger(__name__)

#: How often a waiting ``run`` looks at the cancel flag and the time limit (a reply wakes it at once).
_TICK_S = 0.05
#: After a cancel reaches a child, the step has this long to return by itself before it is killed:
#: with the cancel poll (0.5 s) well within one lease renewal (a third of the lease TTL, >= 0.33 s).
DEFAULT_CANCEL_GRACE_S = 0.25
#: How long ``close`` waits for idle children to exit before it kills them.
_CLOSE_JOIN_S = 2.0
#: Why a child was replaced (``ProcessPool.replacements``; the metric
#: ``plaita_pool_children_replaced_total{reason}``): it died under a job, was killed past a time
#: limit or a cancel's grace, was recycled (``--max-tasks-per-child``, ``--max-memory-per-child-mb``),
#: or its conversation failed otherwise (a job that could not be sent, the caller's own cancel).
REPLACE_REASONS = ("died", "time_limit", "cancelled", "max_tasks", "max_memory", "other")


def _reason(exc: BaseException) -> str:
    """The ``REPLACE_REASONS`` entry for a conversation that ended in ``exc``."""
    if isinstance(exc, ChildProcessDied):
        return "died"
    if isinstance(exc, StepTimeLimit):
        return "time_limit"
    if isinstance(exc, StepCancelled):
        return "cancelled"
    return "other"


class ProcessPool:
    """``size`` children (prefork); ``run`` one job at a time on each. Thread-safe."""

    def __init__(
        self,
        size: int,
        *,
        max_tasks_per_child: int | None = None,
        max_memory_per_child_mb: int | None = None,
        preload: Sequence[str] = (),
        cancel_grace_s: float = DEFAULT_CANCEL_GRACE_S,
        method: str | None = None,
    ) -> None:
        self.size = size
        self.max_tasks_per_child = max_tasks_per_child
        self.max_memory_per_child_mb = max_memory_per_child_mb
        self.cancel_grace_s = cancel_grace_s
        self.method = method or start_method()
        self._preload = ["plaita.runtime.procchild", *preload]
        #: The start method's context (typeshed's BaseContext lacks the Process of the concrete ones).
        self._ctx: Any = multiprocessing.get_context(self.method)
        self._cond = threading.Condition()
        self._idle: list[ChildHandle] = []
        self._started = False
        self._closed = False
        #: Children that could not be replaced yet (a start failed): ``_take`` starts them.
        self._missing = 0
        self._run_ids = itertools.count()
        self._ids_lock = threading.Lock()
        #: Children replaced so far (dead, killed or recycled): tests and the benchmark read it.
        self.replaced = 0
        self._replacements = dict.fromkeys(REPLACE_REASONS, 0)
        #: The worker's logging, copied into each child (taken at ``start``: the CLI has set it up by then).
        self._log_setup: LogSetup | None = None

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> ProcessPool:
        with self._cond:
            if self._started:
                return self
            self._started = True
        self._log_setup = LogSetup.of_this_process()
        if self.method == "forkserver":
            self._ctx.set_forkserver_preload(self._preload)
        children = [self._spawn() for _ in range(self.size)]
        with self._cond:
            self._idle.extend(children)
            self._cond.notify_all()
        # Before multiprocessing's own exit hook, which would wait for non-daemon children for ever.
        atexit.register(self.close)
        return self

    def close(self) -> None:
        """Ask idle children to exit, kill those that do not; a running job's child is killed by its
        ``run`` once it sees the pool closed."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            idle, self._idle = self._idle, []
            self._cond.notify_all()
        for child in idle:
            send_quietly(child.conn, EXIT)
        deadline_s = time.monotonic() + _CLOSE_JOIN_S
        for child in idle:
            retire(child, max(0.0, deadline_s - time.monotonic()))

    def replacements(self) -> dict[str, int]:
        """Children replaced so far, by reason (``REPLACE_REASONS``, every one present)."""
        with self._cond:
            return dict(self._replacements)

    @property
    def pids(self) -> list[int]:
        """Process ids of the idle children (tests)."""
        with self._cond:
            return [c.process.pid or 0 for c in self._idle]

    def _spawn(self) -> ChildHandle:
        parent_end, child_end = self._ctx.Pipe(duplex=True)
        control_read, control_write = self._ctx.Pipe(duplex=False)
        # Not a daemon: a step may start processes of its own; ``close`` (atexit) ends the children.
        progress = self._ctx.RawValue("q", 0)
        process = self._ctx.Process(
            target=serve, args=(child_end, control_read, progress, self._log_setup), name="plaita-step-child"
        )
        process.start()
        child_end.close()
        control_read.close()
        child = ChildHandle(process, parent_end, control_write, progress)
        if hasattr(select, "poll"):  # not on Windows (spawn there; Connection.poll instead)
            child.poller = select.poll()
            child.poller.register(parent_end.fileno(), select.POLLIN)
        return child

    def _take(self) -> ChildHandle:
        with self._cond:
            while not self._idle:
                if self._closed:
                    raise ChildProcessDied("the process pool is closed (the worker is stopping)")
                if self._missing:  # a replacement failed to start before: try again now
                    self._missing -= 1
                    break
                self._cond.wait(1.0)
            else:
                return self._idle.pop()
        return self._spawn_or_count()

    def _give_back(self, child: ChildHandle) -> None:
        with self._cond:
            if not self._closed:
                self._idle.append(child)
                self._cond.notify()
                return
        send_quietly(child.conn, EXIT)
        retire(child, _CLOSE_JOIN_S)

    def _replace(self, child: ChildHandle, reason: str, *, grace_s: float = 0.0) -> None:
        """Kill ``child`` if it lives (after ``grace_s``), and put a new one in its place at once."""
        retire(child, grace_s)
        with self._cond:
            self.replaced += 1
            self._replacements[reason] += 1
            closed = self._closed
        if not closed:
            with contextlib.suppress(ChildProcessDied):  # counted missing: the next _take tries again
                self._give_back(self._spawn_or_count())

    def _spawn_or_count(self) -> ChildHandle:
        """A new child; if none can be started (no fork server, out of memory), the pool remembers
        the missing one and ``ChildProcessDied`` fails this attempt only: the worker goes on."""
        try:
            return self._spawn()
        except Exception as exc:
            with self._cond:
                self._missing += 1
                self._cond.notify()
            logger.error("could not start a step child process: %s: %s", type(exc).__name__, exc)
            raise ChildProcessDied(f"no child process could be started ({type(exc).__name__}: {exc})") from None

    # -- one job ----------------------------------------------------------------------------
    def run(self, job: Any, *, cancel: CancelFlag, time_limit_s: float | None, on_request: OnRequest) -> Any:
        """Run ``job(services)`` in a child; its return value, or what it raised. ``ChildProcessDied``
        when the child died, ``StepTimeLimit`` past ``time_limit_s``, ``StepCancelled`` when
        ``cancel`` was set and the job did not return within the grace (each time the child is
        replaced). A job that cannot be pickled raises here (TypeError, PicklingError)."""
        blob = pickle.dumps(job)
        child = self._take()
        try:
            ok, value, rss_kb = self._converse(child, blob, cancel, time_limit_s, on_request)
        except BaseException as exc:
            self._replace(child, _reason(exc))
            raise
        return self._settled(child, ok, value, rss_kb)

    async def run_async(
        self, job: Any, *, cancel: CancelFlag, time_limit_s: float | None, on_request: OnRequest
    ) -> Any:
        """``run`` for a caller on an event loop: the loop itself waits for the child's pipe, where
        ``asyncio.to_thread(run)`` would add two thread wake-ups per step (measured: ~380 against
        ~110 µs for a 0 ms step). ``on_request`` (a blocking Redis call) runs on a thread."""
        blob = pickle.dumps(job)
        with self._cond:
            child = self._idle.pop() if self._idle else None
        if child is None:  # every child busy (or the pool closed): wait for one on a thread
            return await asyncio.to_thread(
                self.run, job, cancel=cancel, time_limit_s=time_limit_s, on_request=on_request
            )
        try:
            ok, value, rss_kb = await self._converse_async(child, blob, cancel, time_limit_s, on_request)
        except BaseException as exc:
            await asyncio.to_thread(self._replace, child, _reason(exc))
            raise
        return self._settled(child, ok, value, rss_kb)

    def _settled(self, child: ChildHandle, ok: bool, value: Any, rss_kb: int) -> Any:
        """The job's value (or its exception, raised) once its child answered; the child counted
        and, past ``--max-tasks-per-child`` or the memory bound, recycled."""
        child.tasks_done += 1
        self._after(child, rss_kb)
        if not ok:
            raise value
        return value

    async def _converse_async(
        self, child: ChildHandle, blob: bytes, cancel: CancelFlag, time_limit_s: float | None, on_request: OnRequest
    ) -> tuple[bool, Any, int]:
        conn, began_s = child.conn, time.monotonic()
        limit_at = None if time_limit_s is None else began_s + time_limit_s
        kill_at: float | None = None
        run_id = self._next_run_id()
        try:
            conn.send_bytes(RUN + run_id + blob)
            while True:
                if await readable(conn, _wait_s(limit_at, kill_at)):
                    data = conn.recv_bytes()
                    if data[:1] == DONE:
                        ok, value, rss_kb = pickle.loads(data[1:])
                        return ok, value, rss_kb
                    await asyncio.to_thread(answer, conn, on_request, data[1:])
                    continue
                kill_at = self._check(child, run_id, cancel, time_limit_s, limit_at, kill_at)
        except (EOFError, OSError) as exc:
            raise self._death(child, exc) from None

    def _next_run_id(self) -> bytes:
        """A new run's tag: a cancel names the run it is for, so a late one never reaches the next."""
        with self._ids_lock:
            return next(self._run_ids).to_bytes(8, "big")

    def _check(
        self,
        child: ChildHandle,
        run_id: bytes,
        cancel: CancelFlag,
        time_limit_s: float | None,
        limit_at: float | None,
        kill_at: float | None,
    ) -> float | None:
        """Between reads of one run: raise at its time limit or at the end of a cancel's grace;
        forward a cancel (or the pool closing) once. Returns when the child is to be killed."""
        now = time.monotonic()
        if limit_at is not None and now >= limit_at:
            raise StepTimeLimit(f"ran past its time limit of {time_limit_s:g} s: its child process was killed")
        if kill_at is not None and now >= kill_at:
            raise StepCancelled("cancelled while it ran: its child process was killed")
        if kill_at is None and (cancel.is_set() or self._closed):
            child.control.send_bytes(CANCEL + run_id)
            return now + self.cancel_grace_s
        return kill_at

    def run_batch(
        self, jobs: list[Any], cancels: list[CancelFlag], *, on_request: OnRequest
    ) -> tuple[list[tuple[bool, Any]], BaseException | None]:
        """Run fast ``jobs`` (no time limit) in order in one child, in one round trip for all of them
        (plain tasks of a few microseconds: the round trip would cost more than the work). Returns
        ``(ok, value)`` of each job that ran, in order, and the error of the one that was running when
        its child died (``ChildProcessDied``) or was killed for its cancel (``StepCancelled``: see
        ``plaita.runtime.procbatch``), else None. The jobs after those never started (nor those
        past ``max_tasks_per_child``)."""
        child = self._take()
        if self.max_tasks_per_child is not None:
            jobs = jobs[: max(1, self.max_tasks_per_child - child.tasks_done)]
        try:  # at once: what the jobs share (the handler, the keyspace) is pickled once, then referenced
            blob = len(jobs).to_bytes(4, "big") + pickle.dumps(jobs, protocol=pickle.HIGHEST_PROTOCOL)
        except BaseException:
            self._give_back(child)  # nothing was sent: the child is idle as it was
            raise
        results: list[tuple[bool, Any]] = []
        try:
            rss_kb = self._converse_batch(child, blob, cancels[: len(jobs)], results, on_request)
        except ChildProcessDied as exc:
            self._replace(child, "died")
            return results, exc
        except BatchCut as exc:
            self._replace(child, "cancelled")
            return results, exc.error
        except BaseException as exc:
            self._replace(child, _reason(exc))
            raise
        child.tasks_done += len(jobs)
        self._after(child, rss_kb)
        return results, None

    def _converse_batch(
        self,
        child: ChildHandle,
        blob: bytes,
        cancels: list[CancelFlag],
        results: list[tuple[bool, Any]],
        on_request: OnRequest,
    ) -> int:
        """Send the batch; collect results into ``results`` as they come; returns the peak RSS."""
        conn, rss_kb = child.conn, 0
        with self._ids_lock:  # consecutive ids: the child numbers the batch's runs from the first
            first = next(self._run_ids)
            for _ in cancels[1:]:
                next(self._run_ids)
        watch = BatchCancels(child, first, cancels, self.cancel_grace_s)
        child.progress.value = 0  # the child is idle: nobody else writes it now
        try:
            conn.send_bytes(BATCH + first.to_bytes(8, "big") + blob)
            while len(results) < len(cancels):
                if child.wait_s(watch.wait_s(_TICK_S)):
                    data = conn.recv_bytes()
                    if data[:1] == MANY:
                        got, rss_kb = pickle.loads(data[1:])
                        results.extend(got)
                    else:
                        answer(conn, on_request, data[1:])
                    continue
                job = watch.check()  # forwards cancels; a cancelled job past its grace is killed
                if job is not None:
                    raise cut(child, results, job)
        except (EOFError, OSError) as exc:
            fill_plain(child, results)  # every result it sent has been read: EOF comes after them
            raise self._death(child, exc) from None
        return rss_kb

    def _after(self, child: ChildHandle, rss_kb: int) -> None:
        """Back to the idle children, or replaced when worn out (between tasks, never during one)."""
        worn = self._worn_out(child, rss_kb)
        if worn is not None:
            send_quietly(child.conn, EXIT)  # it exits by itself, its successor starts now
            self._replace(child, worn, grace_s=_CLOSE_JOIN_S)
        else:
            self._give_back(child)

    def _worn_out(self, child: ChildHandle, rss_kb: int) -> str | None:
        """Why ``child`` is to be recycled now (``max_tasks``, ``max_memory``), else None."""
        if self.max_tasks_per_child is not None and child.tasks_done >= self.max_tasks_per_child:
            return "max_tasks"
        limit_mb = self.max_memory_per_child_mb
        if limit_mb is not None and rss_kb > limit_mb * 1024:
            logger.info("step child %s uses %d MiB (over %d): replaced", child.process.pid, rss_kb // 1024, limit_mb)
            return "max_memory"
        return None

    def _converse(
        self, child: ChildHandle, blob: bytes, cancel: CancelFlag, time_limit_s: float | None, on_request: OnRequest
    ) -> tuple[bool, Any, int]:
        conn, began_s = child.conn, time.monotonic()
        limit_at = None if time_limit_s is None else began_s + time_limit_s
        kill_at: float | None = None  # set once a cancel was forwarded
        run_id = self._next_run_id()
        try:
            conn.send_bytes(RUN + run_id + blob)
            while True:
                if child.wait_s(_wait_s(limit_at, kill_at)):
                    data = conn.recv_bytes()
                    if data[:1] == DONE:
                        ok, value, rss_kb = pickle.loads(data[1:])
                        return ok, value, rss_kb
                    answer(conn, on_request, data[1:])
                    continue
                kill_at = self._check(child, run_id, cancel, time_limit_s, limit_at, kill_at)
        except (EOFError, OSError) as exc:
            raise self._death(child, exc) from None

    def _death(self, child: ChildHandle, exc: BaseException) -> ChildProcessDied:
        child.process.join(REAP_S)
        code = child.process.exitcode
        logger.warning("step child %s died (%s)", child.process.pid, describe_exit(code))
        return ChildProcessDied(f"its child process died: {describe_exit(code)}", code)


def _wait_s(limit_at: float | None, kill_at: float | None) -> float:
    """How long one read of a run may wait: a tick, or less when its time limit or its cancel's
    grace ends sooner."""
    now = time.monotonic()
    return max(0.0, min([_TICK_S] + [t - now for t in (limit_at, kill_at) if t is not None]))
