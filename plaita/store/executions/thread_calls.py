"""Script calls sent from an event loop by one thread of their own (``ThreadCalls``): the flow
runner's batcher (``CallBatcher``, ``plaita.store.executions.execution_io``) uses it for a client
the loop's own connection cannot serve (``plaita.store.executions.loop_calls``), or where that
connection is unsupported.

The loop queues the call and awaits a future; the thread takes whatever is queued, sends it as
one pipeline (``plaita.store.calls.run_calls``: each call is still one atomic, fenced script,
with its own reply or error) and resolves the futures with one hand-back per loop. While one
batch is on the wire the next one gathers.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any

from plaita.store.calls import ScriptCall, run_calls
from plaita.store.executions.loop_calls import resolve

#: Calls one round trip carries at most (more wait for the next one).
MAX_BATCH = 256

_Queued = tuple[ScriptCall, asyncio.Future[Any], asyncio.AbstractEventLoop]


class ThreadCalls:
    """One daemon thread (started with the first call) sending queued calls in batches."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._queued: list[_Queued] = []
        self._stopped = False
        self._thread: threading.Thread | None = None

    async def run(self, call: ScriptCall) -> Any:
        """``call.run()``, sent with whatever else is queued; raises what the call raised."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        with self._cond:
            if self._stopped:
                raise RuntimeError("flow runner closed: no more Redis calls")
            self._queued.append((call, future, loop))
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="plaita-flow-io", daemon=True)
                self._thread.start()
            self._cond.notify()
        return await future

    def stop(self) -> None:
        """Send what is queued, then end the thread."""
        with self._cond:
            self._stopped = True
            self._cond.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(2.0)

    def _take(self) -> list[_Queued] | None:
        with self._cond:
            while not self._queued and not self._stopped:
                self._cond.wait()
            if not self._queued:
                return None
            batch, self._queued = self._queued[:MAX_BATCH], self._queued[MAX_BATCH:]
            return batch

    def _serve(self) -> None:
        while (batch := self._take()) is not None:
            outcomes = _send(batch)
            by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], Any]]] = {}
            for (_, future, loop), outcome in zip(batch, outcomes, strict=True):
                by_loop.setdefault(loop, []).append((future, outcome))
            for loop, settled in by_loop.items():
                _hand_back(loop, settled)


def _send(batch: list[_Queued]) -> list[Any]:
    """Each call's outcome (a reply, or the exception it ended in), one pipeline per client."""
    outcomes: list[Any] = [None] * len(batch)
    by_client: dict[int, list[int]] = {}
    for i, (call, _, _) in enumerate(batch):
        by_client.setdefault(id(call.client), []).append(i)
    for indexes in by_client.values():
        calls = [batch[i][0] for i in indexes]
        try:
            results = run_calls(calls[0].client, calls)
        except BaseException as exc:  # noqa: B036 - every waiting execution must hear of it
            results = [exc] * len(calls)
        for i, result in zip(indexes, results, strict=True):
            outcomes[i] = result
    return outcomes


def _hand_back(loop: asyncio.AbstractEventLoop, settled: list[tuple[asyncio.Future[Any], Any]]) -> None:
    with contextlib.suppress(RuntimeError):  # a closed loop: its worker is exiting, nobody awaits these
        loop.call_soon_threadsafe(_resolve, settled)


def _resolve(settled: list[tuple[asyncio.Future[Any], Any]]) -> None:
    for future, outcome in settled:
        resolve(future, outcome)
