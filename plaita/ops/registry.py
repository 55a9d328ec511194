"""Worker registry: a TTL'd JSON key per worker, refreshed by a heartbeat thread.

``plaita:registry:flow_worker:{instance}`` (TTL 30 s, heartbeat 10 s: an entry outlives two
missed beats, and a dead worker's is gone within 30 s). The heartbeat survives outages: a failed
beat is logged once and retried; the next successful one re-creates the key. On stop the entry
is deleted.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from plaita.store import fleet
from plaita.store.fleet_access import FleetAccess

logger = logging.getLogger(__name__)

#: Seconds a registry entry lives without a heartbeat.
DEFAULT_REGISTRY_TTL_S = 30.0
#: Seconds between heartbeats.
DEFAULT_HEARTBEAT_INTERVAL_S = 10.0


class Registry:
    """Keeps this worker's registry entry alive while the worker runs."""

    def __init__(
        self,
        fleet_access: FleetAccess,
        *,
        instance_id: str,
        snapshot: Callable[[], dict[str, Any]],
        ttl_s: float = DEFAULT_REGISTRY_TTL_S,
        interval_s: float = DEFAULT_HEARTBEAT_INTERVAL_S,
        on_beat: Callable[[], None] | None = None,
    ) -> None:
        self.fleet = fleet_access
        self.instance_id = instance_id
        self.key = fleet.registry_key(instance_id)
        self._snapshot = snapshot
        self.ttl_s = ttl_s
        self.interval_s = interval_s
        self._on_beat = on_beat
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._failing = False
        self.registered = False
        self.last_beat_at: float | None = None
        self._thread = threading.Thread(target=self._run, name="plaita-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def beat_soon(self) -> None:
        """Publish a fresh entry now (a state change happened)."""
        self._wake.set()

    def beat(self) -> bool:
        """Write the entry once; False (logged once per outage) when Redis is unreachable."""
        entry = self._snapshot()
        entry["last_heartbeat"] = time.time()
        try:
            self.fleet.write_entry(self.instance_id, entry, self.ttl_s)
        except Exception as exc:  # any failure: the heartbeat retries, it never ends
            if not self._failing:
                logger.warning("registry heartbeat failed (%s: %s); retrying", type(exc).__name__, exc)
            self._failing = True
            self.registered = False
            return False
        if self._failing:
            logger.info("registry heartbeat restored; %s registered again", self.instance_id)
        self._failing = False
        self.registered = True
        self.last_beat_at = time.time()
        return True

    def _delete(self) -> None:
        try:
            self.fleet.delete_entry(self.instance_id)
        except Exception as exc:  # best effort: the entry expires with its TTL anyway
            logger.debug("could not remove registry entry %s: %s (it expires in %.0f s)", self.key, exc, self.ttl_s)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.beat()
            if self._on_beat is not None:
                self._on_beat()
            # Retry faster while failing so the entry is back soon after Redis is.
            self._wake.wait(self.interval_s if not self._failing else min(self.interval_s, 1.0))
            self._wake.clear()

    def stop(self, timeout_s: float = 0.15) -> None:
        """Stop beating and remove the entry, waiting at most twice ``timeout_s`` (best effort).

        Stopping must stay fast when Redis is unreachable: the delete runs on its own daemon
        thread and is abandoned after the timeout (the entry then expires with its TTL); when
        the last heartbeat failed, or is still waiting for Redis, it is not even tried.
        """
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout_s)
        if self._failing or self._thread.is_alive():
            logger.debug("registry entry %s left to expire (Redis unreachable)", self.key)
        else:
            remover = threading.Thread(target=self._delete, name="plaita-unregister", daemon=True)
            remover.start()
            remover.join(timeout_s)
        self.registered = False
