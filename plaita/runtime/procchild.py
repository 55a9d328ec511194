"""The child side of ``--pool process`` (``plaita.runtime.procpool``): one process runs one job at a
time, sent by the parent over its own pipe, and answers with what the job returned or raised.

A job is a picklable callable ``job(services)`` (a flow step's ``StepJob``, a plain handler's
``TaskJob``): what it needs of the parent while it runs goes through ``ChildServices`` (the cancel
flag, set by the parent; ``request`` for a live call such as ``ctx.publish``). The child never
talks to Redis for plaita: the parent holds the leases, renews and acks.

Two pipes per child. On the first, one byte says what follows: parent to child ``R`` (a run: an
8-byte run id, then the pickled job, unpickled here so that a job that cannot be imported is that
attempt's error), ``B`` (a batch of fast jobs: the first run id, their count in 4 bytes, then the
list of jobs pickled at once, so what they share, the handler and the keyspace, is pickled once;
run in order with consecutive ids), ``P`` (the pickled reply to a request), ``X`` (exit);
child to parent ``Q`` (a pickled request), ``D`` (the pickled ``(ok, value, peak_rss_kb)`` of a
run) and ``M`` (``([(ok, value), ...], peak_rss_kb)`` of the next jobs of a batch, in order). The
second carries only cancels (``C`` and the run id), read by a thread while a job runs; the main
thread reads the first itself, with no hand-over between threads on the way of a job.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import resource
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from plaita.errors import StepRaised
from plaita.tasks import CancelFlag

RUN, BATCH, REPLY, EXIT, REQUEST, DONE, MANY, CANCEL = b"R", b"B", b"P", b"X", b"Q", b"D", b"M", b"C"
#: The child's traceback kept with an exception sent to the parent (the innermost frames).
TRACEBACK_CHARS = 3000


@dataclass(frozen=True)
class LogSetup:
    """The worker's root logger as configured (``plaita.cli`` or the embedding program), copied
    into each child at its start: a fork server's child is a fresh interpreter's descendant and
    inherits no logging configuration, only the worker's stderr (its file descriptor 2)."""

    level: int
    format: str
    datefmt: str | None

    @staticmethod
    def of_this_process() -> LogSetup | None:
        """The root logger's level and its first handler's format; None when nothing is configured
        (then a child logs as an unconfigured Python does: warnings and above, bare, to stderr)."""
        root = logging.getLogger()
        if not root.handlers:
            return None
        formatter = root.handlers[0].formatter
        if formatter is None:  # what a handler without a formatter writes: the bare message
            return LogSetup(root.level, "%(message)s", None)
        return LogSetup(root.level, formatter._fmt or "%(message)s", formatter.datefmt)

    def apply(self) -> None:
        """Log to this process's stderr (the worker's) at the worker's level and format."""
        logging.basicConfig(level=self.level, format=self.format, datefmt=self.datefmt, stream=sys.stderr, force=True)


@dataclass
class ChildServices:
    """What a job may use of the child: the cancel flag of its run and the parent's live calls."""

    cancel: CancelFlag
    request: Callable[..., Any]
    _loop: list[asyncio.AbstractEventLoop] = field(default_factory=list)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The child's event loop for ``async def`` jobs (one per child, made on first use)."""
        if not self._loop:
            self._loop.append(asyncio.new_event_loop())
        return self._loop[0]


def peak_rss_kb() -> int:
    """This process's peak resident memory (``ru_maxrss``: KiB on Linux, bytes on macOS), read
    after every job: one system call, where reading ``/proc`` costs a file open per task."""
    peak = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    return peak // 1024 if sys.platform == "darwin" else peak


def serve(conn: Connection, control: Connection, progress: Any, log_setup: LogSetup | None = None) -> None:
    """The child's main: run jobs sent on ``conn`` until told to exit or the parent is gone;
    cancels come on ``control``, read by a thread of their own while a job runs. A step's log
    records go to the worker's stderr with the worker's level and format (``log_setup``)."""
    if log_setup is not None:
        log_setup.apply()
    # The parent decides when a child ends (drain, recycle, kill): a terminal's Ctrl-C or a
    # SIGTERM to the whole process group (systemd's default) must not cut a step short here.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _Child(conn, control, progress).serve()


class _Child:
    def __init__(self, conn: Connection, control: Connection, progress: Any) -> None:
        self._conn = conn
        #: Shared with the parent (a ``RawValue``): jobs of the current batch finished so far.
        self._progress = progress
        self._control = control
        #: One request (and its reply) on the pipe at a time, whichever thread of the job asks.
        self._request_lock = threading.Lock()
        self._flag_lock = threading.Lock()
        self._run_id = -1
        self._cancel = CancelFlag()
        #: Runs of the current batch cancelled before they started (their flag is set at start).
        self._cancelled_ahead: set[int] = set()
        threading.Thread(target=self._watch_control, name="plaita-child-control", daemon=True).start()

    def _watch_control(self) -> None:
        """Cancels, each naming its run (a late one must not reach the next job). The parent gone
        (EOF) ends the child at once, whatever the job does: nobody is left to take its result."""
        while True:
            try:
                data = self._control.recv_bytes()
            except (EOFError, OSError):
                os._exit(0)
            run_id = int.from_bytes(data[1:9], "big")
            with self._flag_lock:
                if run_id == self._run_id:
                    self._cancel.set()
                elif run_id > self._run_id:
                    self._cancelled_ahead.add(run_id)

    def serve(self) -> None:
        services = ChildServices(self._cancel, self._request)
        while True:
            try:
                data = self._conn.recv_bytes()
            except (EOFError, OSError):
                os._exit(0)
            kind, first_id = data[:1], int.from_bytes(data[1:9], "big")
            if kind == RUN:
                ok, value = self._run(first_id, data[9:], services)
                self._conn.send_bytes(DONE + _done(ok, value))
            elif kind == BATCH:
                self._run_batch(first_id, _batch_jobs(data[9:]), services)
            else:
                break  # EXIT
        if services._loop:
            services.loop.close()

    def _run_batch(self, first_id: int, jobs: list[Any], services: ChildServices) -> None:
        """Run a batch of fast jobs in order and send their results in one write. A job that kills
        this process must not take the results of the jobs before it along: any result but a plain
        success (``None``) is sent before the next job starts, and the shared ``progress`` counts
        the jobs finished, so the parent knows the unsent ones were plain successes."""
        plain = 0  # plain successes not sent yet
        for i, job in enumerate(jobs):
            ok, value = self._run(first_id + i, None, services, job)
            if ok and value is None:
                plain += 1
            else:
                self._conn.send_bytes(MANY + _many([*[(True, None)] * plain, (ok, value)]))
                plain = 0
            self._progress.value = i + 1
        if plain:
            self._conn.send_bytes(MANY + _many([(True, None)] * plain))
        with self._flag_lock:
            self._cancelled_ahead.clear()

    def _run(self, run_id: int, blob: bytes | None, services: ChildServices, job: Any = None) -> tuple[bool, Any]:
        """Run ``job``, or the job pickled in ``blob`` (unpickled here: one that cannot be imported
        is that attempt's error); ``(True, value)`` or ``(False, exception)``."""
        with self._flag_lock:
            self._run_id, self._cancel = run_id, CancelFlag()
            services.cancel = self._cancel
            if run_id in self._cancelled_ahead:
                self._cancel.set()
        try:
            if blob is not None:
                job = pickle.loads(blob)
            return True, job(services)
        except BaseException as exc:  # noqa: B036 - every raise of user code is the attempt's failure
            _note_traceback(exc)
            return False, exc

    def _request(self, kind: str, *args: Any) -> Any:
        """A live call into the parent (``ctx.publish``): blocks for its reply; raises what it raised."""
        try:
            data = pickle.dumps((kind, args))
        except Exception as exc:  # the value cannot even cross: it is not strict JSON either
            raise ValueError(f"{kind}: the value cannot be sent to the worker process ({exc})") from None
        with self._request_lock:
            self._conn.send_bytes(REQUEST + data)
            ok, value = pickle.loads(self._conn.recv_bytes()[1:])  # after REPLY
        if not ok:
            raise value
        return value


@dataclass(frozen=True)
class _Raises:
    """Stands in for each job of a batch that could not be unpickled: its run raises why."""

    error: BaseException

    def __call__(self, services: ChildServices) -> Any:
        raise self.error


def _batch_jobs(data: bytes) -> list[Any]:
    """The jobs of a batch message (after the run id): their count, then the pickled list."""
    count = int.from_bytes(data[:4], "big")
    try:
        jobs: list[Any] = pickle.loads(data[4:])
    except BaseException as exc:  # noqa: B036 - a module that cannot be imported: each job fails with it
        return [_Raises(exc)] * count
    return jobs


def _done(ok: bool, value: Any) -> bytes:
    """The pickled ``(ok, value, peak_rss_kb)`` of a finished job; what cannot cross the boundary
    becomes a ``StepRaised``."""
    try:
        data = pickle.dumps((ok, value, peak_rss_kb()))
        if not ok:
            pickle.loads(data)  # an exception class whose __init__ needs other arguments fails here
        return data
    except Exception as exc:
        return pickle.dumps((False, _substitute(ok, value, exc), peak_rss_kb()))


def _crossable(ok: bool, value: Any) -> tuple[bool, Any]:
    """``(ok, value)``, or its ``StepRaised`` stand-in when it would not cross the boundary."""
    if ok and value is None:  # what nearly every plain handler returns: nothing to check
        return ok, value
    try:
        data = pickle.dumps(value)
        if not ok:
            pickle.loads(data)
        return ok, value
    except Exception as exc:
        return False, _substitute(ok, value, exc)


def _substitute(ok: bool, value: Any, exc: Exception) -> BaseException:
    if ok:
        return TypeError(f"the result of type {type(value).__name__} cannot be sent to the worker ({exc})")
    substitute = StepRaised(type(value).__name__, _text(value))
    for note in getattr(value, "__notes__", ()):  # the child's traceback (_note_traceback)
        substitute.add_note(str(note))
    return substitute


def _many(results: list[tuple[bool, Any]]) -> bytes:
    """The pickled ``([(ok, value), ...], peak_rss_kb)`` of jobs of a batch, each as ``_done`` makes it."""
    return pickle.dumps(([_crossable(ok, value) for ok, value in results], peak_rss_kb()))


def _note_traceback(exc: BaseException) -> None:
    """A pickled exception loses its traceback: keep the child's as a note (shown with it)."""
    with contextlib.suppress(Exception):
        text = "".join(traceback.format_exception(exc))[-TRACEBACK_CHARS:]
        exc.add_note(f"in the step's child process {os.getpid()}:\n{text}")


def _text(exc: BaseException) -> str:
    with contextlib.suppress(Exception):
        return str(exc)
    return "<unprintable>"
