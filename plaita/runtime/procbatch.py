"""Cancels in a batch of fast plain tasks (``ProcessPool.run_batch``, ``--pool process``).

A plain task's ``cancelled`` flag is set when the worker loses the task's lease (a task with an
``execution_id``, or one that outlived a renewal interval and took a lease) or abandons it (a stop
that does not wait: the task is handed back). Each cancel is forwarded to its job once, started
or not (the child sets the flag when the job starts). A cancelled job still running
``grace_s`` after it started with its flag set, or after the flag reached it, has its child
killed, as a step's would be: the jobs before it keep their results, it fails with
``StepCancelled``, and the jobs after it never started (they run again in another child).
"""

from __future__ import annotations

import contextlib
import pickle
import time
from typing import Any

from plaita.errors import PlaitaError, StepCancelled
from plaita.runtime.procchild import CANCEL, MANY
from plaita.runtime.procwire import REAP_S, ChildHandle
from plaita.tasks import CancelFlag


class BatchCut(PlaitaError):
    """A cancelled job of a batch ran past its grace and its child was killed. ``error``: that
    job's failure, or None when the child had gone on to the next job just before the kill (that
    one was cut by the kill, not by a cancel of its own: it counts as not started)."""

    def __init__(self, error: StepCancelled | None) -> None:
        super().__init__("a cancelled job of a batch ran past its grace: its child process was killed")
        self.error = error


class BatchCancels:
    """The cancels of one batch's jobs: each forwarded once, and the grace of the running one."""

    def __init__(self, child: ChildHandle, first_id: int, cancels: list[CancelFlag], grace_s: float) -> None:
        self._child = child
        self._first_id = first_id
        self._cancels = cancels
        self._grace_s = grace_s
        self._forwarded: set[int] = set()
        #: (job, when its child is killed): the running job, cancelled.
        self._kill: tuple[int, float] | None = None

    def wait_s(self, tick_s: float) -> float:
        """How long the next read may wait: ``tick_s``, or less when a kill is due sooner."""
        if self._kill is None:
            return tick_s
        return max(0.0, min(tick_s, self._kill[1] - time.monotonic()))

    def check(self) -> int | None:
        """Forward the cancels not forwarded yet; the job whose child is to be killed now, else None."""
        running = int(self._child.progress.value)
        for i in range(running, len(self._cancels)):
            if i not in self._forwarded and self._cancels[i].is_set():
                self._child.control.send_bytes(CANCEL + (self._first_id + i).to_bytes(8, "big"))
                self._forwarded.add(i)
        now = time.monotonic()
        if self._kill is not None and self._kill[0] < running:  # it returned within its grace
            self._kill = None
        if self._kill is None and running in self._forwarded:
            self._kill = (running, now + self._grace_s)
        if self._kill is not None and now >= self._kill[1]:
            return self._kill[0]
        return None


def cut(child: ChildHandle, results: list[tuple[bool, Any]], job: int) -> BatchCut:
    """Kill ``child`` under cancelled ``job``; ``results`` completed with what it had finished."""
    child.process.kill()
    child.process.join(REAP_S)
    with contextlib.suppress(EOFError, OSError):  # what it wrote before it died, then EOF
        while child.conn.poll(0):
            data = child.conn.recv_bytes()
            if data[:1] == MANY:
                results.extend(pickle.loads(data[1:])[0])
    fill_plain(child, results)
    if len(results) != job:
        return BatchCut(None)
    return BatchCut(StepCancelled("cancelled while it ran (its lease was lost): its child process was killed"))


def fill_plain(child: ChildHandle, results: list[tuple[bool, Any]]) -> None:
    """Once every result the child sent has been read: the jobs it finished beyond those were plain
    successes it had not sent yet (``procchild._Child._run_batch``)."""
    results.extend([(True, None)] * max(0, int(child.progress.value) - len(results)))
