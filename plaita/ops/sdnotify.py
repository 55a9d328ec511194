"""systemd's sd_notify protocol: one datagram to $NOTIFY_SOCKET (no dependency needed)."""

from __future__ import annotations

import logging
import os
import socket

logger = logging.getLogger(__name__)


def notify(message: str) -> bool:
    """Send ``message`` (e.g. ``READY=1``) to systemd; False when not under systemd or on error."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]  # abstract namespace socket
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.connect(address)
            sock.sendall(message.encode("utf-8"))
    except OSError as exc:
        logger.debug("sd_notify(%r) failed: %s", message, exc)
        return False
    return True


def watchdog_interval_s() -> float | None:
    """Half of systemd's WatchdogSec for this process, or None when the watchdog is off."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return max(0.1, int(usec) / 2_000_000)
    except ValueError:
        return None
