"""A real HTTP server on a free loopback port that receives alert webhooks: it answers 2xx, a
chosen error status, a redirect, or hangs (until the test ends), and records every request."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def doc(self) -> dict[str, Any]:
        value = json.loads(self.body)
        assert isinstance(value, dict)
        return value


class Webhook:
    """``mode``: ``ok`` (204), ``status`` (answer ``status``), ``hang`` (never answer until
    ``release``), ``trickle`` (answer a byte every 0.1 s until ``release``), ``redirect`` (302 to
    another path). Change it at any time. ``fail_first``:
    the first that many requests answer ``status`` whatever the mode."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.status = 500
        self.fail_first = 0
        self.received: list[Received] = []
        self._cond = threading.Condition()
        self._released = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                outer._serve(self)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = int(self.httpd.server_address[1])
        self.url = f"http://127.0.0.1:{self.port}/hooks/T0KEN-in-the-path"
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def _serve(self, req: BaseHTTPRequestHandler) -> None:
        length = int(req.headers.get("Content-Length") or 0)
        body = req.rfile.read(length)
        with self._cond:
            self.received.append(Received(req.path, {k.lower(): v for k, v in req.headers.items()}, body))
            self._cond.notify_all()
            mode = "status" if len(self.received) <= self.fail_first else self.mode
        if mode == "hang":
            self._released.wait(60)  # bounded: a test that forgets to release still ends
            return
        if mode == "trickle":  # an answer that never ends: a byte every 0.1 s, up to 60 s
            req.send_response(200)
            req.send_header("Content-Length", "600")
            req.end_headers()
            for _ in range(600):
                if self._released.wait(0.1):
                    return
                req.wfile.write(b".")
                req.wfile.flush()
            return
        if mode == "redirect":
            req.send_response(302)
            req.send_header("Location", f"http://127.0.0.1:{self.port}/elsewhere")
        else:
            req.send_response(204 if mode == "ok" else self.status)
        req.send_header("Content-Length", "0")
        req.end_headers()

    def wait_for(self, n: int, timeout_s: float = 10.0) -> list[Received]:
        """The first ``n`` requests, once they arrived; AssertionError after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while len(self.received) < n:
                left_s = deadline - time.monotonic()
                if left_s <= 0:
                    raise AssertionError(f"webhook got {len(self.received)} of {n} requests in {timeout_s} s")
                self._cond.wait(left_s)
            return list(self.received[:n])

    def events(self, name: str) -> list[dict[str, Any]]:
        with self._cond:
            return [r.doc for r in self.received if r.doc.get("event") == name]

    def release(self) -> None:
        self._released.set()


@contextmanager
def webhook() -> Iterator[Webhook]:
    hook = Webhook()
    hook._thread.start()
    try:
        yield hook
    finally:
        hook.release()
        hook.httpd.shutdown()
        hook.httpd.server_close()
