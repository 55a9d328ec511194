"""Run the app on uvicorn over a socket bound by the caller, exiting 0 on SIGTERM or SIGINT."""

from __future__ import annotations

import contextlib
import signal
import socket
from collections.abc import Iterator

import uvicorn
from starlette.applications import Starlette


class _Server(uvicorn.Server):
    """uvicorn re-raises a captured signal after its graceful shutdown (so the process dies of
    it); a service manager reads that as a crash. Here a signal is a request to stop, exit 0."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def serve(app: Starlette, sock: socket.socket) -> None:
    """Serve until SIGTERM/SIGINT; logging stays as the CLI configured it (no uvicorn log config)."""
    config = uvicorn.Config(app, log_config=None, log_level="warning", access_log=False, lifespan="on")
    try:
        _Server(config).run(sockets=[sock])
    finally:
        sock.close()
