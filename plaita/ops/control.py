"""Remote control over pub/sub: ``plaita:control:{instance}`` and ``plaita:control:all``.

Commands are JSON ``{"command": "stop"|"pause"|"resume"|"status", "now": bool,
"reply_to": key, "request_id": str}``. The listener only posts requests to the worker (the
owner thread turns them into FSM events). It reconnects forever with backoff and never dies:
a listener that ended on a Redis error would leave the worker deaf to stop and pause.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from plaita.fsm import BackoffPolicy, ErrorKind
from plaita.ops.commands import BadControlMessage, parse_control_message
from plaita.store.errors import classify
from plaita.store.fleet import CONTROL_ALL, control_channel
from plaita.store.fleet_access import FleetAccess

logger = logging.getLogger(__name__)

#: Longest wait for one pub/sub message; bounds how long the thread outlives ``stop()``.
POLL_S = 0.5


class ControlListener:
    """Subscribes to this worker's channels and dispatches commands, forever.

    Give it a door on a client of its own (``close_client=True``): a pub/sub connection borrowed from
    the worker's pool is torn down under the listener whenever that pool is closed or reset
    (shutdown), which used to surface as a bogus ``TypeError`` from ``select``.
    """

    def __init__(
        self,
        fleet_access: FleetAccess,
        *,
        instance_id: str,
        on_command: Callable[[str, dict[str, Any]], dict[str, Any] | None],
        close_client: bool = False,
    ) -> None:
        self.fleet = fleet_access
        self._close_client = close_client
        self.instance_id = instance_id
        self.channels = [control_channel(instance_id), CONTROL_ALL]
        self._on_command = on_command
        self._stop = threading.Event()
        self._backoff = BackoffPolicy(base_s=0.1, cap_s=2.0, persistent_s=5.0)
        self.connected = threading.Event()
        self._failing_since: float | None = None
        self._thread = threading.Thread(target=self._run, name="plaita-control", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Ask the thread to end. Not joined: it is a daemon, and waiting for its next poll
        would only slow an idle worker's exit."""
        self._stop.set()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                # Every message, confirmations included: the listener counts as subscribed only
                # once Redis confirmed both channels (SUBSCRIBE itself does not wait for a reply).
                pubsub: Any = None
                try:
                    # Inside the try: a cluster client connects to learn its slot map right here.
                    pubsub = self.fleet.open_pubsub()
                    self._listen(pubsub)
                except Exception as exc:  # any failure: reconnect with backoff, never end the thread
                    self.connected.clear()
                    if self._stop.is_set():
                        return  # our own shutdown tore the connection down: nothing to report
                    if self._failing_since is None:
                        self._failing_since = time.monotonic()
                        logger.warning(
                            "control channel unavailable (%s: %s); re-subscribing with backoff until Redis answers",
                            type(exc).__name__,
                            exc,
                        )
                    self._stop.wait(self._backoff.schedule(persistent=classify(exc) is ErrorKind.PERSISTENT))
                finally:
                    try:
                        if pubsub is not None:
                            pubsub.close()
                    except Exception:  # closing a broken connection may fail too; nothing to do
                        logger.debug("closing the control pubsub failed", exc_info=True)
        finally:
            self.connected.clear()
            if self._close_client:
                try:
                    self.fleet.close()
                except Exception:  # best effort on the way out
                    logger.debug("closing the control client failed", exc_info=True)

    def _listen(self, pubsub: Any) -> None:
        """Subscribe and dispatch commands until stopped; raises on any connection failure."""
        pubsub.subscribe(*self.channels)
        confirmed = 0
        while not self._stop.is_set():
            message = pubsub.get_message(timeout=POLL_S)
            if message is None:
                continue
            kind = message.get("type")
            if kind == "message":
                self._handle(message.get("data"))
            elif kind == "subscribe":
                confirmed += 1
                if confirmed == len(self.channels):
                    self.connected.set()
                    self._backoff.reset()
                    if self._failing_since is not None:
                        logger.info(
                            "control channel re-subscribed after %.1f s", time.monotonic() - self._failing_since
                        )
                        self._failing_since = None

    def _handle(self, data: Any) -> None:
        try:
            message = parse_control_message(data if isinstance(data, bytes | str) else str(data))
        except BadControlMessage as exc:
            logger.warning("ignored a control message: %s", exc)
            return
        name, command = message.command, message.as_dict()
        logger.info("control command %r received", name)
        try:
            answer = self._on_command(name, command)
        except Exception:  # a bug in a command handler must not end the listener
            logger.exception("control command %r failed", name)
            return
        reply_to = command.get("reply_to")
        if answer is not None and isinstance(reply_to, str) and reply_to:
            answer = {**answer, "request_id": command.get("request_id"), "instance_id": self.instance_id}
            try:
                self.fleet.push_reply(reply_to, answer)
            except Exception as exc:  # a lost reply must not end the listener
                logger.warning("could not send the %r reply (%s)", name, exc)
