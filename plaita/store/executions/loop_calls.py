"""Script calls sent from an event loop on a connection of the loop's own (``LoopCalls``).

The flow runner's thread batcher (``CallBatcher``, ``plaita.store.executions.execution_io``) costs,
per batch, a hand-off to its I/O thread and one back to the loop, and both threads want the GIL: the loop computes while
Redis waits for the next batch and Redis works while the loop waits for the reply. Here the
loop writes the calls to an asyncio connection (one write for every call queued in a loop
iteration, or while ``MAX_WRITES_IN_FLIGHT`` writes are unanswered) and reads their replies
on the loop as they come: a batch goes out while the one before is still running (with
``appendfsync always``, during its fsync: Redis takes what came meanwhile in its next pass and
fsyncs once for it), and nothing crosses a thread.

Each call is still atomic and fenced on its own, with its own reply or error, as in
``plaita.store.calls.run_calls``. The calls of one write that share a script (at c64 a write
carries ~14 steps) go out as one EVALSHA of its batch twin (``plaita.store.batch_scripts``): the
server's cost of an EVALSHA is mostly the call's, not the script's work. A NOSCRIPT reply means
that call (or batch) did not run, and only its calls are sent again, each alone (its script
loaded) by ``ScriptCall.run`` on a thread; a batch's twin is loaded for the batches after. A lost connection, or no
reply within the client's ``socket_timeout``, fails every call waiting on it with the
ConnectionError or TimeoutError a blocking call would raise (whether those ran is unknown, as
for a blocking call); the next call connects anew.

The connection is made by redis-py itself (AUTH, SELECT, CLIENT SETNAME as the client is
configured), then its socket is handed to asyncio. Only a client this can serve the same way
(``servable``: not TLS, not RESP3, not a cluster) may be given to it. Where the redis-py
installed lacks the private parts this relies on (``BaseParser.parse_error``, a connection's
``_sock``), ``run`` raises ``LoopUnsupported`` before any call is sent, and the runner's batcher
sends through its thread instead (with one warning): slower, never wrong.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import socket
import time
from collections.abc import Coroutine
from typing import Any

import hiredis
import redis

from plaita.errors import PlaitaError
from plaita.store.batch_scripts import Batch, Entry, Waiting, entries, load_twins, packed
from plaita.store.calls import ScriptCall

logger = logging.getLogger(__name__)

#: redis-py internals this relies on (pinned ``redis>=8.0,<9``, but private): where a
#: redis-py version lacks them, ``run`` raises ``LoopUnsupported`` before anything is sent and
#: the calls go the thread batcher's way instead of failing.
_parse_error: Any = None
try:
    from redis._parsers.base import BaseParser

    _parse_error = getattr(BaseParser, "parse_error", None)
except ImportError:  # pragma: no cover - a redis-py without it
    pass
#: The attribute of a connected ``redis.Connection`` holding its socket.
_SOCK_ATTRIBUTE = "_sock"

#: No reply for this long with calls waiting (and no ``socket_timeout`` set): the connection is dropped.
DEFAULT_REPLY_TIMEOUT_S = 30.0

#: Writes on the wire at once per connection: the calls queued meanwhile go out in one write
#: as soon as one is answered. Two let Redis work on one while the loop computes the next and
#: still make the writes big, which ``appendfsync always`` wants (one fsync per server pass);
#: one and no limit measured within noise of it (docs/benchmarks.md, "Flows over concurrency").
MAX_WRITES_IN_FLIGHT = 2


class LoopUnsupported(PlaitaError):
    """The running loop cannot watch a socket (no ``add_reader``: Windows' proactor loop);
    raised before anything is sent, so the call may go another way."""


class _ReplyError(PlaitaError):
    """An error reply as hiredis hands it over; turned into redis-py's exception (``_error``)."""


def _error(reply: _ReplyError) -> Exception:
    error: Exception = _parse_error(str(reply))
    return error


def servable(client: Any) -> bool:
    """True when ``client``'s calls can go over a loop connection: one server, plain TCP or a
    Unix socket, RESP2 (the replies the scripts' parsers expect)."""
    if type(client) is not redis.Redis:
        return False
    pool = client.connection_pool
    plain = pool.connection_class in (redis.Connection, redis.UnixDomainSocketConnection)
    return plain and str(pool.connection_kwargs.get("protocol") or 2) == "2"


def _connected_socket(client: redis.Redis) -> socket.socket:
    """A socket redis-py connected and set up (AUTH, SELECT, ...), detached from redis-py."""
    pool = client.connection_pool
    conn = pool.connection_class(**pool.connection_kwargs)
    conn.connect()
    sock = getattr(conn, _SOCK_ATTRIBUTE, None)
    if not isinstance(sock, socket.socket):  # only the handshake was sent: the call may go another way
        conn.disconnect()
        raise LoopUnsupported(f"redis-py {redis.__version__} keeps no socket in Connection.{_SOCK_ATTRIBUTE}")
    try:  # the first batch (and the first after a restart, which reconnects) finds its twin there
        load_twins(conn)
    except BaseException:
        conn.disconnect()
        raise
    setattr(conn, _SOCK_ATTRIBUTE, None)  # ours now: the connection object must not shut it down when collected
    sock.setblocking(False)
    return sock


class _Connection:
    """One pipelined connection: calls in the order written, replies in the same order. It
    owns its socket (the loop's reader and writer callbacks, no asyncio transport), so it can
    be closed whether or not its loop still runs (``close``)."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, client: redis.Redis, sock: socket.socket, timeout_s: float, decode: Any
    ) -> None:
        self.loop, self.client, self.sock = loop, client, sock
        self.timeout_s = timeout_s
        self.lost = False
        self._reader = hiredis.Reader(replyError=_ReplyError, **decode)
        #: Calls not written yet (``send``): packed when their write goes out (``_flush``).
        self._queued: list[Waiting] = []
        #: What the written replies answer, in the order written.
        self._waiting: collections.deque[Entry] = collections.deque()
        #: Replies each write on the wire still owes, oldest first.
        self._in_flight: collections.deque[int] = collections.deque()
        #: Bytes the socket did not take yet (a full send buffer): sent when it is writable.
        self._unsent = b""
        self._writer_on = False
        self._flush_armed = False
        self._progress_s = time.monotonic()
        self._watch: asyncio.TimerHandle | None = None
        #: NOSCRIPT re-sends in flight (strong references: the loop keeps weak ones only).
        self._reruns: set[asyncio.Task[None]] = set()
        loop.add_reader(sock.fileno(), self._readable)  # NotImplementedError on a loop without one

    def send(self, call: ScriptCall, future: asyncio.Future[Any]) -> None:
        """Queue ``call`` for the next write."""
        if not self._waiting and not self._queued:
            self._progress_s = time.monotonic()
        self._queued.append((call, future))
        self._arm_flush()
        if self._watch is None:
            self._watch = self.loop.call_later(self.timeout_s, self._check_progress)

    def waiting_calls(self) -> int:
        """Calls queued or written and not answered yet (a batch counts its calls). Also read
        from another thread: copies made in one step, as the loop may change them meanwhile."""
        written = tuple(self._waiting)
        return len(tuple(self._queued)) + sum(len(e.items) if isinstance(e, Batch) else 1 for e in written)

    def _arm_flush(self) -> None:
        if self._queued and not self._flush_armed and len(self._in_flight) < MAX_WRITES_IN_FLIGHT:
            self._flush_armed = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_armed = False
        queued, self._queued = self._queued, []
        if self.lost:  # closed meanwhile: nothing more is sent
            for _, future in queued:
                resolve(future, redis.ConnectionError("connection to Redis closed"))
            return
        out: list[bytes] = []
        try:
            grouped = entries(queued)
        except Exception:  # a call entries cannot group (a key of no hashable type): each alone
            self._pack_alone(queued, out)
            grouped = []
        for entry in grouped:
            try:
                out.append(packed(entry))
            except Exception:  # an argument Redis cannot take: each call alone, the error only its own
                self._pack_alone(entry.items if isinstance(entry, Batch) else [entry], out)
                continue
            self._waiting.append(entry)
        if out:
            self._in_flight.append(len(out))
            self._write(b"".join(out))

    def _pack_alone(self, items: list[Waiting], out: list[bytes]) -> None:
        for item in items:
            try:
                out.append(packed(item))
            except Exception as exc:  # as ``LoopCalls.run`` would raise it for a call sent alone
                resolve(item[1], exc)
                continue
            self._waiting.append(item)

    def _write(self, data: bytes) -> None:
        """One request on the wire (``bench.countrt`` counts these as round trips)."""
        self._unsent += data
        if not self._writer_on:  # else the writer callback sends it, after what waits already
            self._writable()

    def _writable(self) -> None:
        try:
            sent = self.sock.send(self._unsent)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            self._fail(redis.ConnectionError(f"error writing to Redis: {exc}"))
            return
        self._unsent = self._unsent[sent:]
        if self._unsent and not self._writer_on:  # a full send buffer: the rest when there is room
            self._writer_on = True
            self.loop.add_writer(self.sock.fileno(), self._writable)
        elif not self._unsent and self._writer_on:
            self._writer_on = False
            self.loop.remove_writer(self.sock.fileno())

    def _readable(self) -> None:
        try:
            data = self.sock.recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._fail(redis.ConnectionError(f"error reading from Redis: {exc}"))
            return
        if not data:
            self._fail(redis.ConnectionError("connection to Redis closed by the server"))
            return
        try:
            self._reader.feed(data)
            while (reply := self._reader.gets()) is not False:
                self._progress_s = time.monotonic()
                self._answered(reply)
        except Exception as exc:  # a reply we cannot read or match: the rest of the stream is unusable
            self._fail(redis.ConnectionError(f"unreadable reply from Redis: {exc!r}"))

    def _answered(self, reply: Any) -> None:
        """``reply`` is the oldest waiting entry's (the server answers in order)."""
        if not self._waiting:
            raise redis.ConnectionError("a reply with no call waiting for it")
        entry = self._waiting.popleft()
        if isinstance(entry, Batch):
            self._settle_batch(entry, reply)
        else:
            self._settle_safely(entry[0], entry[1], reply)
        self._in_flight[0] -= 1
        if not self._in_flight[0]:
            self._in_flight.popleft()
            self._arm_flush()

    def _settle_safely(
        self, call: ScriptCall, future: asyncio.Future[Any], reply: Any, *, in_batch: bool = False
    ) -> None:
        try:
            if in_batch and isinstance(reply, _ReplyError):  # it ran: never sent again, whatever it says
                resolve(future, _error(reply))
                return
            self._settle(call, future, reply)
        except Exception as exc:  # e.g. an error reply redis-py no longer parses: still that call's
            resolve(future, redis.ConnectionError(f"unreadable reply from Redis: {exc!r}"))

    def _settle(self, call: ScriptCall, future: asyncio.Future[Any], reply: Any) -> None:
        if isinstance(reply, _ReplyError):
            error = _error(reply)
            if isinstance(error, redis.exceptions.NoScriptError):  # it did not run: load and send again
                self._rerun(_rerun(call, future))
                return
            resolve(future, error)
        else:  # read by the call that awaits it (``LoopCalls.run``), not in this reader callback
            resolve(future, reply)

    def _settle_batch(self, batch: Batch, reply: Any) -> None:
        """Each call of ``batch`` its own item of the array ``reply``; an error reply instead
        of the array is every call's (NOSCRIPT: none ran, each is sent again alone)."""
        items = batch.items
        if isinstance(reply, list) and len(reply) == len(items):
            for (call, future), item in zip(items, reply, strict=True):
                self._settle_safely(call, future, item, in_batch=True)
            return
        try:
            error = _error(reply) if isinstance(reply, _ReplyError) else None
        except Exception as exc:  # an error reply redis-py no longer parses
            error = redis.ConnectionError(f"unreadable reply from Redis: {exc!r}")
        if isinstance(error, redis.exceptions.NoScriptError):
            self._rerun(_rerun_batch(batch))
            return
        if error is None:
            error = redis.ConnectionError(f"unreadable reply from Redis to a batch of {len(items)}: {reply!r:.200}")
        for _, future in items:
            resolve(future, error)

    def _rerun(self, coro: Coroutine[Any, Any, None]) -> None:
        rerun = self.loop.create_task(coro)
        self._reruns.add(rerun)  # a strong reference: the loop keeps weak ones only
        rerun.add_done_callback(self._reruns.discard)

    def _check_progress(self) -> None:
        self._watch = None
        if (not self._waiting and not self._queued) or self.lost:
            return
        left_s = self._progress_s + self.timeout_s - time.monotonic()
        if left_s > 0:
            self._watch = self.loop.call_later(left_s, self._check_progress)
            return
        self._fail(redis.TimeoutError(f"no reply from Redis within {self.timeout_s:g} s"))

    def _fail(self, error: redis.RedisError) -> None:
        """Every waiting call ends in ``error``; the connection is closed, never used again."""
        self.close()
        waiting, self._waiting = self._waiting, collections.deque()
        queued, self._queued = self._queued, []
        for entry in waiting:
            for _, future in entry.items if isinstance(entry, Batch) else (entry,):
                resolve(future, error)
        for _, future in queued:
            resolve(future, error)

    def shut(self) -> None:
        """Closed by its owner: calls still waiting fail as disconnected (a closed loop has
        nobody awaiting them, and no way to tell them)."""
        if self.loop.is_closed():
            self.close()
        else:
            self._fail(redis.ConnectionError("flow runner closed: its Redis connection is closed"))

    def close(self) -> None:
        """Close the socket (on the loop's thread, or once the loop no longer runs)."""
        if self.lost:
            return
        self.lost = True
        if not self.loop.is_closed():
            self.loop.remove_reader(self.sock.fileno())
            self.loop.remove_writer(self.sock.fileno())
        if self._watch is not None:
            self._watch.cancel()
        self.sock.close()


async def _rerun(call: ScriptCall, future: asyncio.Future[Any]) -> None:
    try:  # the raw reply, as ``_settle`` hands it over: ``LoopCalls.run`` reads it
        outcome: Any = await asyncio.to_thread(call.script, call.client, call.keys, call.args)
    except Exception as exc:  # that call's outcome, as in run_calls
        outcome = exc
    resolve(future, outcome)


async def _rerun_batch(batch: Batch) -> None:
    """A batch refused as NOSCRIPT: its twin loaded for the batches after, each call sent again
    alone (as a call refused alone is: its own script loaded, its own reply or error)."""
    client = batch.items[0][0].client
    with contextlib.suppress(Exception):  # the calls' own re-sends meet (and report) what failed it
        await asyncio.to_thread(client.script_load, batch.script.source)
    await asyncio.gather(*(_rerun(call, future) for call, future in batch.items))


def resolve(future: asyncio.Future[Any], outcome: Any) -> None:
    """Hand ``outcome`` (a result, or an exception to raise) to the call awaiting ``future``."""
    if future.done():  # the awaiting step was cancelled meanwhile
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


class LoopCalls:
    """Sends the calls of the executions on one event loop (``run``), per client one connection."""

    def __init__(self) -> None:
        self._conns: dict[tuple[int, int], _Connection] = {}
        self._connecting: dict[tuple[int, int], asyncio.Future[_Connection]] = {}
        self._stopped = False

    async def run(self, call: ScriptCall) -> Any:
        """``call.run()``, pipelined with the loop's other calls; raises what the call raised."""
        if self._stopped:
            raise RuntimeError("flow runner closed: no more Redis calls")
        if _parse_error is None:
            raise LoopUnsupported(f"redis-py {redis.__version__} has no BaseParser.parse_error")
        loop = asyncio.get_running_loop()
        key = (id(loop), id(call.client))
        conn = self._conns.get(key)
        if conn is None or conn.lost or conn.loop is not loop or conn.client is not call.client:  # ids get reused
            conn = await self._connect(key, loop, call.client)
        future: asyncio.Future[Any] = loop.create_future()
        conn.send(call, future)
        return call.parse(await future)  # the refusal a reply names is raised here, to the caller

    async def _connect(self, key: tuple[int, int], loop: asyncio.AbstractEventLoop, client: redis.Redis) -> _Connection:
        """The loop's connection for ``client``: one connect at a time, awaited by every caller."""
        pending = self._connecting.get(key)
        if pending is None:
            pending = self._connecting[key] = loop.create_task(self._open(key, loop, client))
            pending.add_done_callback(lambda _: self._connecting.pop(key, None))
        return await asyncio.shield(pending)  # stored by ``_open``: also when every caller was cancelled

    async def _open(self, key: tuple[int, int], loop: asyncio.AbstractEventLoop, client: redis.Redis) -> _Connection:
        kwargs = client.connection_pool.connection_kwargs
        timeout_s = float(kwargs.get("socket_timeout") or DEFAULT_REPLY_TIMEOUT_S)
        decode: dict[str, Any] = {}
        if kwargs.get("decode_responses"):  # as redis-py's own parser would decode them
            decode = {"encoding": kwargs.get("encoding", "utf-8"), "errors": kwargs.get("encoding_errors", "strict")}
        sock = await asyncio.to_thread(_connected_socket, client)
        if self._stopped:  # stopped while connecting: ``stop`` did not see this one
            sock.close()
            raise RuntimeError("flow runner closed: no more Redis calls")
        try:
            conn = self._conns[key] = _Connection(loop, client, sock, timeout_s, decode)
            return conn
        except NotImplementedError:
            sock.close()
            raise LoopUnsupported(f"{type(loop).__name__} has no add_reader") from None
        except BaseException:
            sock.close()
            raise

    def stop(self) -> None:
        """Refuse new calls and close the connections (calls still waiting fail as disconnected)."""
        self._stopped = True
        conns, self._conns = list(self._conns.values()), {}
        for conn in conns:
            if conn.loop.is_running() and not _running_here(conn.loop):
                conn.loop.call_soon_threadsafe(conn.shut)  # the loop's thread owns its callbacks
            else:
                conn.shut()


def _running_here(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False
