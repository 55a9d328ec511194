"""The Redis calls of executions running on an event loop, sent together by one thread.

With ``await runner.run_async(task)`` every create and checkpoint would otherwise be a thread
hop of its own (``asyncio.to_thread``) and a round trip of its own. Here the loop queues the
call and awaits a future; one thread takes whatever is queued, sends it as one pipeline
(``plaita.store.calls.run_calls``: each call is still one atomic, fenced script, with its own
reply or error) and resolves the futures with one hand-back per loop. While one batch is on
the wire the next one gathers: at ``--concurrency`` N up to N calls share a round trip (and,
with ``appendfsync always``, the server's fsync), and at 1 a call costs what it did.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from typing import Any

from plaita.store.calls import ScriptCall, run_calls
from plaita.store.executions.loop_calls import LoopCalls, LoopUnsupported, resolve, servable

logger = logging.getLogger(__name__)

#: Calls one round trip carries at most (more wait for the next one).
MAX_BATCH = 256

_Queued = tuple[ScriptCall, asyncio.Future[Any], asyncio.AbstractEventLoop]


class CallBatcher:
    """One daemon thread (started with the first call) sending queued calls in batches; the
    calls of a client a loop connection can serve go over that instead (``loop_connection``,
    ``plaita.store.executions.loop_calls``: no thread hand-offs, batches pipelined)."""

    def __init__(self, *, loop_connection: bool = True) -> None:
        self._loop_calls = LoopCalls() if loop_connection else None
        self._cond = threading.Condition()
        self._queued: list[_Queued] = []
        self._stopped = False
        self._thread: threading.Thread | None = None

    async def run(self, call: ScriptCall) -> Any:
        """``call.run()``, sent with whatever else is queued; raises what the call raised."""
        if self._loop_calls is not None and servable(call.client):
            try:
                return await self._loop_calls.run(call)
            except LoopUnsupported as exc:  # nothing was sent: the thread sends it, and every later call
                if self._loop_calls is not None:  # once: the calls that met it at the same time say nothing
                    logger.warning("flow runner: Redis calls go through a thread, not the loop connection: %s", exc)
                    self._loop_calls = None
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
        """Send what is queued, then end the thread (and close the loop connections)."""
        if self._loop_calls is not None:
            self._loop_calls.stop()
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
