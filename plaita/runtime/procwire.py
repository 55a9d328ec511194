"""The pipes of ``--pool process`` (``plaita.runtime.procpool``): a child's handles, and the small
pieces every conversation with a child shares (waiting for its pipe, answering its live calls,
ending it, naming how it died)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import multiprocessing
import pickle
import signal
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from plaita.runtime.procchild import REPLY

#: How long a dead child's exit status is waited for (its pipe closed first).
REAP_S = 2.0

OnRequest = Callable[..., Any]


def start_method() -> str:
    """``forkserver`` where the platform has it, else ``spawn`` (see the module docstring)."""
    return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


def describe_exit(exit_code: int | None) -> str:
    """``exit code 3`` / ``killed by signal 9 (SIGKILL)`` / ``exit status unknown``."""
    if exit_code is None:
        return "exit status unknown"
    if exit_code < 0:
        try:
            name = signal.Signals(-exit_code).name
        except ValueError:
            name = "?"
        return f"killed by signal {-exit_code} ({name})"
    return f"exit code {exit_code}"


@dataclass
class ChildHandle:
    process: BaseProcess
    conn: Connection
    #: Write end of the child's cancel pipe (``plaita.runtime.procchild``).
    control: Connection
    #: Shared counter of the jobs of the current batch the child finished (``RawValue("q")``).
    progress: Any
    tasks_done: int = 0
    #: Waits for the child's pipe: made once, where ``Connection.poll`` builds a selector per call.
    poller: Any = None

    def wait_s(self, timeout_s: float) -> bool:
        """True once the child's pipe has something to read (or closed), within ``timeout_s``."""
        if self.poller is None:
            return bool(self.conn.poll(timeout_s))
        return bool(self.poller.poll(max(0, math.ceil(timeout_s * 1000))))


async def readable(conn: Connection, timeout_s: float) -> bool:
    """Wait on the running loop until ``conn`` has something to read (or closed), ``timeout_s`` at most."""
    loop = asyncio.get_running_loop()
    ready = loop.create_future()
    fd = conn.fileno()
    loop.add_reader(fd, _settle, ready, True)
    timer = loop.call_later(timeout_s, _settle, ready, False)
    try:
        return bool(await ready)
    finally:
        timer.cancel()
        loop.remove_reader(fd)


def _settle(future: asyncio.Future[bool], value: bool) -> None:
    if not future.done():
        future.set_result(value)


def answer(conn: Connection, on_request: OnRequest, request: bytes) -> None:
    """Run the child's live call here (in the worker process) and send back its value or error."""
    kind = "request"
    try:
        kind, args = pickle.loads(request)
        reply: tuple[bool, Any] = (True, on_request(kind, *args))
    except Exception as exc:  # the step's own error (ValueError, LeaseLostError): raised there
        reply = (False, exc)
    try:
        data = pickle.dumps(reply)
    except (pickle.PicklingError, TypeError, AttributeError) as exc:
        data = pickle.dumps((False, RuntimeError(f"{kind}: its reply cannot be sent to the child ({exc})")))
    conn.send_bytes(REPLY + data)


def send_quietly(conn: Connection, data: bytes) -> None:
    with contextlib.suppress(OSError, ValueError):  # the child is gone already
        conn.send_bytes(data)


def retire(child: ChildHandle, grace_s: float = 0.0) -> None:
    """Kill ``child`` unless it has exited (within ``grace_s``), reap it, close its pipe."""
    if grace_s > 0:
        child.process.join(grace_s)
    if child.process.exitcode is None:
        child.process.kill()
    child.process.join(REAP_S)
    child.conn.close()
    child.control.close()
    child.process.close()
