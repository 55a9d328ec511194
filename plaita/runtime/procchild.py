"""The child side of ``--pool process`` (``plaita.runtime.procpool``): one process runs one job at a
time, sent by the parent over its own pipe, and answers with what the job returned or raised.

A job is a picklable callable ``job(services)`` (a flow step's ``StepJob``, a plain handler's
``TaskJob``): what it needs of the parent while it runs goes through ``ChildServices`` (the cancel
flag, set by the parent; ``request`` for a live call such as ``ctx.publish``). The child never
talks to Redis for plaita: the parent holds the leases, renews and acks.

Messages, parent to child: ``("run", bytes)`` (the pickled job: unpickled here, so a job that
cannot be imported is that attempt's error), ``("cancel",)``, ``("reply", ok, value)``,
``("exit",)``. Child to parent: ``("request", kind, args)``, ``("done", ok, value, rss_kb)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
import queue
import resource
import signal
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from plaita.tasks import CancelFlag

#: The child's traceback kept with an exception sent to the parent (the innermost frames).
TRACEBACK_CHARS = 3000


class StepRaised(Exception):
    """Stands in for an exception that cannot cross the process boundary (it does not pickle, or
    does not unpickle); ``kind`` keeps the original class name for the execution's ``error``."""

    def __init__(self, kind: str, text: str) -> None:
        super().__init__(f"{kind}: {text}")
        self.kind = kind

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.kind, str(self).partition(": ")[2]))


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


def rss_kb() -> int:
    """This process's resident memory now (Linux ``/proc``), else its peak (``ru_maxrss``)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024
    except (OSError, ValueError, IndexError):
        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def serve(conn: Connection) -> None:
    """The child's main: run jobs until told to exit or the parent is gone."""
    # The parent decides when a child ends (drain, recycle, kill): a terminal's Ctrl-C or a
    # SIGTERM to the whole process group (systemd's default) must not cut a step short here.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _Child(conn).serve()


class _Child:
    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._send_lock = threading.Lock()
        self._jobs: queue.SimpleQueue[tuple[bytes, CancelFlag] | None] = queue.SimpleQueue()
        self._replies: queue.SimpleQueue[tuple[bool, Any]] = queue.SimpleQueue()
        self._cancel = CancelFlag()
        self._services: list[ChildServices] = []
        threading.Thread(target=self._read, name="plaita-child-reader", daemon=True).start()

    def _read(self) -> None:
        """Route the parent's messages; the parent gone (EOF) ends the child at once, whatever the
        job is doing: nobody is left to hold its lease or take its result."""
        while True:
            try:
                msg = self._conn.recv()
            except (EOFError, OSError):
                os._exit(0)
            kind = msg[0]
            if kind == "run":
                # A fresh flag per run, made here: a cancel right behind the run reaches this one.
                self._cancel = CancelFlag()
                self._jobs.put((msg[1], self._cancel))
            elif kind == "cancel":
                self._cancel.set()
            elif kind == "reply":
                self._replies.put((msg[1], msg[2]))
            else:  # exit
                self._jobs.put(None)

    def serve(self) -> None:
        services: ChildServices | None = None
        while (item := self._jobs.get()) is not None:
            blob, cancel = item
            if services is None:
                services = ChildServices(cancel, self._request)
            services.cancel = cancel
            ok, value = self._run(blob, services)
            self._send(_done(ok, value))
        if services is not None and services._loop:
            services.loop.close()

    @staticmethod
    def _run(blob: bytes, services: ChildServices) -> tuple[bool, Any]:
        try:
            job = pickle.loads(blob)
            return True, job(services)
        except BaseException as exc:  # noqa: B036 - every raise of user code is the attempt's failure
            _note_traceback(exc)
            return False, exc

    def _request(self, kind: str, *args: Any) -> Any:
        """A live call into the parent (``ctx.publish``): blocks for its reply; raises what it raised."""
        try:
            data = pickle.dumps(("request", kind, args))
        except Exception as exc:  # the value cannot even cross: it is not strict JSON either
            raise ValueError(f"{kind}: the value cannot be sent to the worker process ({exc})") from None
        with self._send_lock:
            self._conn.send_bytes(data)
        ok, value = self._replies.get()
        if not ok:
            raise value
        return value

    def _send(self, data: bytes) -> None:
        with self._send_lock:
            self._conn.send_bytes(data)


def _done(ok: bool, value: Any) -> bytes:
    """The pickled ``done`` message; what cannot cross the boundary becomes a ``StepRaised``."""
    try:
        data = pickle.dumps(("done", ok, value, rss_kb()))
        if not ok:
            pickle.loads(data)  # an exception class whose __init__ needs other arguments fails here
        return data
    except Exception as exc:
        if ok:
            value = TypeError(f"the result of type {type(value).__name__} cannot be sent to the worker ({exc})")
        else:
            substitute = StepRaised(type(value).__name__, _text(value))
            for note in getattr(value, "__notes__", ()):  # the child's traceback (_note_traceback)
                substitute.add_note(str(note))
            value = substitute
        return pickle.dumps(("done", False, value, rss_kb()))


def _note_traceback(exc: BaseException) -> None:
    """A pickled exception loses its traceback: keep the child's as a note (shown with it)."""
    with contextlib.suppress(Exception):
        text = "".join(traceback.format_exception(exc))[-TRACEBACK_CHARS:]
        exc.add_note(f"in the step's child process {os.getpid()}:\n{text}")


def _text(exc: BaseException) -> str:
    with contextlib.suppress(Exception):
        return str(exc)
    return "<unprintable>"
