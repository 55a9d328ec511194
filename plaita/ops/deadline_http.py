"""urllib handlers that give one request a deadline for the whole exchange.

urllib's ``timeout`` bounds each socket operation, not the request: a receiver that trickles a
byte a second holds a POST for as long as it likes (an alert webhook held the sender 37 s, and
the events queued behind it waited). Here a request that carries ``deadline_s`` (a
``time.monotonic()`` value) has its socket shut down at that moment: a read blocked in it returns
at once and the request fails like any cut connection.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import urllib.request
from collections.abc import Callable
from typing import Any


def _cut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # closed already (the exchange ended in time)
        sock.shutdown(socket.SHUT_RDWR)


def _with_deadline(http_class: Callable[..., Any], deadline_s: float | None) -> Callable[..., Any]:
    """``http_class`` whose connection, once connected, is cut at ``deadline_s``."""

    def make(host: str, **kwargs: Any) -> Any:
        conn = http_class(host, **kwargs)
        connect = conn.connect

        def connect_then_arm() -> None:
            connect()
            if deadline_s is not None:
                timer = threading.Timer(max(0.0, deadline_s - time.monotonic()), _cut, (conn.sock,))
                timer.daemon = True  # a pending cut never keeps a process alive
                timer.start()

        conn.connect = connect_then_arm
        return conn

    return make


class _DeadlineMixin:
    def do_open(self, http_class: Any, req: Any, **kwargs: Any) -> Any:
        wrapped = _with_deadline(http_class, getattr(req, "deadline_s", None))
        return super().do_open(wrapped, req, **kwargs)  # type: ignore[misc]


class DeadlineHTTPHandler(_DeadlineMixin, urllib.request.HTTPHandler):
    """``http://`` with the request's ``deadline_s``."""


class DeadlineHTTPSHandler(_DeadlineMixin, urllib.request.HTTPSHandler):
    """``https://`` with the request's ``deadline_s``."""
