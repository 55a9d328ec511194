"""What an operator sees and steers: status file, registry heartbeat, remote control,
Prometheus metrics, /healthz and /readyz, and systemd notifications.

Kept apart from the worker's consume loop: everything here runs on its own threads, talks to
Redis only through its own calls that may fail freely, and never fires FSM triggers (control
commands become requests the owner thread turns into events).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from plaita.fsm import State
from plaita.ops import sdnotify
from plaita.ops.control import ControlListener
from plaita.ops.metrics import HealthServer, Metrics
from plaita.ops.registry import Registry
from plaita.store.client import make_client

if TYPE_CHECKING:
    from plaita.runtime.worker import Worker

logger = logging.getLogger(__name__)

#: How often the status file is rewritten at most.
STATUS_EVERY_S = 1.0
#: How often queue gauges (XLEN, pending, lag, oldest pending, DLQ) are sampled.
QUEUE_SAMPLE_EVERY_S = 5.0
#: Registry ``status`` for each lifecycle state (the original's vocabulary).
REGISTRY_STATUS = {
    State.INIT: "starting",
    State.ENSURE_GROUP: "running",
    State.RECLAIMING: "running",
    State.READING: "running",
    State.BACKOFF: "running",
    State.PAUSED: "paused",
    State.STOPPING: "draining",
    State.STOPPED: "stopped",
}


class Operations:
    """The operator-facing side of one worker."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        settings = worker.settings
        self.metrics = Metrics()
        client = worker.queue.client
        self.registry: Registry | None = None
        self.control: ControlListener | None = None
        if settings.registry_enabled:
            self.registry = Registry(
                client,
                instance_id=worker.instance_id,
                snapshot=self._registry_entry,
                ttl_s=settings.registry_ttl_s,
                interval_s=settings.heartbeat_interval_s,
            )
            # The listener gets a client (so a pool) of its own: closing or resetting the worker's
            # pool must never tear its pub/sub connection down under it.
            control_client = make_client(
                settings.redis_url,
                socket_timeout_s=settings.socket_timeout_s,
                client_name=f"plaita-control:{settings.consumer_name}".replace(" ", "_"),
            )
            self.control = ControlListener(
                control_client, instance_id=worker.instance_id, on_command=worker.on_command, close_client=True
            )
        self.http: HealthServer | None = None
        if settings.metrics_port is not None:
            self.http = HealthServer(settings.metrics_host, settings.metrics_port, self.metrics, worker.readiness)
        self._status_written_at_s = 0.0
        self._stop = threading.Event()
        self._monitor = threading.Thread(target=self._monitor_loop, name="plaita-monitor", daemon=True)
        self._ready_sent = False
        self._task_counters: dict[str, Any] = {}

    def start(self) -> None:
        if self.http is not None:
            self.http.start()
            logger.info(
                "metrics on http://%s:%d/metrics (/healthz, /readyz)", self.worker.settings.metrics_host, self.http.port
            )
        if self.registry is not None:
            self.registry.start()
        if self.control is not None:
            self.control.start()
        self._monitor.start()

    def stop(self) -> None:
        """Unregister and stop every thread (best effort, bounded)."""
        sdnotify.notify("STOPPING=1")
        self._stop.set()
        if self.control is not None:
            self.control.stop()
        if self.registry is not None:
            self.registry.stop()
        if self.http is not None:
            self.http.stop()
        self.metrics.up.set(0)
        self.write_status(force=True)

    def _registry_entry(self) -> dict[str, Any]:
        """The worker's status plus where its health endpoints listen: during a Redis outage the
        dashboard asks the worker itself, since the registry is exactly what cannot be read."""
        entry = self.worker.status()
        if self.http is not None:
            entry["metrics_host"] = self.worker.settings.metrics_host
            entry["metrics_port"] = self.http.port
        return entry

    # -- events from the worker --------------------------------------------------------
    def on_transition(self, source: State, dest: State) -> None:
        self.metrics.on_transition(source, dest, self.worker.lifecycle.previous_state_duration_s)
        if self.registry is not None:
            self.registry.beat_soon()
        if dest is State.READING and not self._ready_sent:
            self._ready_sent = sdnotify.notify("READY=1")
        sdnotify.notify(f"STATUS={dest.name}")
        self.write_status(force=True)

    def count(self, outcome: str, n: int = 1) -> None:
        child = self._task_counters.get(outcome)
        if child is None:  # labels() costs a lock and a dict build: look each child up once
            child = self._task_counters[outcome] = self.metrics.tasks.labels(outcome=outcome)
        child.inc(n)

    # -- periodic work -----------------------------------------------------------------
    def _monitor_loop(self) -> None:
        watchdog_s = sdnotify.watchdog_interval_s()
        next_sample = 0.0
        tick_s = min(1.0, watchdog_s) if watchdog_s else 1.0
        while not self._stop.wait(tick_s):
            self.write_status()
            self.metrics.in_flight.set(self.worker.in_flight)
            # Tie the systemd watchdog to the owner loop turning (reading, or retrying in
            # BACKOFF), not to process liveness: a wedged loop gets restarted, an outage does not.
            if watchdog_s and self.worker.loop_age_s() < self.worker.stall_after_s:
                sdnotify.notify("WATCHDOG=1")
            now = time.monotonic()
            if self.http is not None and now >= next_sample:
                next_sample = now + QUEUE_SAMPLE_EVERY_S
                self._sample_queue()

    def _sample_queue(self) -> None:
        try:
            stats = self.worker.queue.stream_stats()
        except Exception as exc:  # sampling is best effort; the next tick tries again
            logger.debug("queue sampling failed: %s", exc)
            return
        self.metrics.set_queue(stats)

    def write_status(self, *, force: bool = False) -> None:
        path = self.worker.settings.status_file
        if not path:
            return
        now = time.monotonic()
        if not force and now - self._status_written_at_s < STATUS_EVERY_S:
            return
        self._status_written_at_s = now
        target = Path(path)
        tmp = target.with_name(f"{target.name}.{threading.get_ident()}.tmp")
        try:
            tmp.write_text(json.dumps(self.worker.status()), encoding="utf-8")
            tmp.replace(target)
        except OSError as exc:
            logger.debug("could not write status file %s: %s", path, exc)


def read_status_file(path: str | Path) -> dict[str, Any] | None:
    """The JSON a worker keeps at ``--status-file``, or None while absent or half written."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def registry_status(state: State) -> str:
    return REGISTRY_STATUS[state]


__all__ = ["Operations", "read_status_file", "registry_status"]
