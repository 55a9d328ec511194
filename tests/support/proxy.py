"""A fault-injecting TCP proxy on loopback, for chaos tests between a worker and Redis.

Modes: pass-through; ``blackhole()`` (connections stay open and new ones are accepted, but no
byte moves in either direction: data waits in kernel buffers, as on a dropped network path);
``reset_all()`` (every client connection closed with RST); ``restore()``; ``latency_s`` (delay
per forwarded chunk). Every thread is a daemon and ``close()`` stops them all.
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading
from collections.abc import Iterator

LOOPBACK = "127.0.0.1"
#: How often blocked threads look at the mode and the close flag.
_POLL_S = 0.05
_CHUNK_BYTES = 65536


def _rst_close(sock: socket.socket) -> None:
    """Close ``sock`` so the peer sees a connection reset (SO_LINGER on, timeout 0)."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()


def _shutdown_close(sock: socket.socket) -> None:
    """Shut down (wakes a thread blocked in send) and close, ignoring errors."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()


class _Pair:
    """One client connection and its upstream connection."""

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client = client
        self.upstream = upstream
        self.closed = threading.Event()
        self._lock = threading.Lock()
        self._half_closed = 0

    def close(self, *, reset: bool = False) -> None:
        with self._lock:
            if self.closed.is_set():
                return
            self.closed.set()
        if reset:
            _rst_close(self.client)
        else:
            _shutdown_close(self.client)
        _shutdown_close(self.upstream)

    def direction_ended(self) -> None:
        """One direction saw EOF; when both have, the pair is done."""
        with self._lock:
            self._half_closed += 1
            done = self._half_closed >= 2
        if done:
            self.close()


class FaultProxy:
    """Forwards 127.0.0.1:<port> to 127.0.0.1:<target_port>, with injectable faults."""

    def __init__(self, target_port: int, *, latency_s: float = 0.0) -> None:
        self.target_port = target_port
        self.latency_s = latency_s
        self._flowing = threading.Event()
        self._flowing.set()
        self._closed = threading.Event()
        self._pairs: set[_Pair] = set()
        self._pairs_lock = threading.Lock()
        self.accepted = 0
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((LOOPBACK, 0))
        self._listener.listen(128)
        self._listener.settimeout(_POLL_S)
        self.port = int(self._listener.getsockname()[1])
        self._accept_thread = threading.Thread(target=self._accept_loop, name="proxy-accept", daemon=True)
        self._accept_thread.start()

    @property
    def url(self) -> str:
        return f"redis://{LOOPBACK}:{self.port}/0"

    # -- faults -----------------------------------------------------------------------
    def blackhole(self) -> None:
        """Forward nothing in either direction; keep and accept connections (silent path)."""
        self._flowing.clear()

    def restore(self) -> None:
        """Forward again; data held during a blackhole flows on."""
        self._flowing.set()

    def reset_all(self) -> int:
        """Close every client connection with RST; returns how many were reset."""
        with self._pairs_lock:
            pairs = list(self._pairs)
            self._pairs.clear()
        for pair in pairs:
            pair.close(reset=True)
        return len(pairs)

    @property
    def connections(self) -> int:
        with self._pairs_lock:
            return len(self._pairs)

    def close(self) -> None:
        """Stop accepting, drop every connection and let all threads end."""
        self._closed.set()
        self._flowing.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._pairs_lock:
            pairs = list(self._pairs)
            self._pairs.clear()
        for pair in pairs:
            pair.close()
        self._accept_thread.join(2)

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- plumbing ---------------------------------------------------------------------
    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                client, _addr = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection((LOOPBACK, self.target_port), timeout=2)
            except OSError:
                _rst_close(client)  # target down: the client sees a reset, like a dead server
                continue
            client.settimeout(None)
            upstream.settimeout(None)
            self.accepted += 1
            pair = _Pair(client, upstream)
            with self._pairs_lock:
                self._pairs.add(pair)
            for src, dst, name in ((client, upstream, "up"), (upstream, client, "down")):
                threading.Thread(target=self._pump, args=(pair, src, dst), name=f"proxy-{name}", daemon=True).start()

    def _wait_flowing(self, pair: _Pair) -> bool:
        """Block while blackholed; False once the proxy or the pair is closed."""
        while not self._flowing.wait(_POLL_S):
            if self._closed.is_set() or pair.closed.is_set():
                return False
        return not (self._closed.is_set() or pair.closed.is_set())

    def _chunks(self, pair: _Pair, src: socket.socket) -> Iterator[bytes]:
        """Chunks read from ``src`` (only while flowing); ends on EOF, error or close."""
        while self._wait_flowing(pair):
            try:
                ready, _, _ = select.select([src], [], [], _POLL_S)
                if not ready:
                    continue
                data = src.recv(_CHUNK_BYTES)
            except (OSError, ValueError):
                pair.close()
                return
            if not data:
                return
            yield data

    def _pump(self, pair: _Pair, src: socket.socket, dst: socket.socket) -> None:
        try:
            for data in self._chunks(pair, src):
                if self.latency_s > 0 and self._closed.wait(self.latency_s):
                    return
                # A chunk read just as a blackhole began is held until the path is back.
                if not self._wait_flowing(pair):
                    return
                try:
                    dst.sendall(data)
                except OSError:
                    pair.close()
                    return
            if pair.closed.is_set():
                return
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)
            pair.direction_ended()
        finally:
            if pair.closed.is_set():
                with self._pairs_lock:
                    self._pairs.discard(pair)
