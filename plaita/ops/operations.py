"""What an operator sees and steers for one worker: status file, registry heartbeat, remote
control, Prometheus metrics, /healthz and /readyz, and systemd notifications.

``Operations`` implements the runtime's observer interface; the CLI attaches it to a worker
(``attach_operations``). Everything here runs on its own threads, talks to Redis only through
its own calls that may fail freely, and never fires FSM triggers: control commands become
requests the owner thread turns into events.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from plaita.fsm import ErrorKind, State
from plaita.ops import sdnotify
from plaita.ops.alert_events import WorkerAlerts
from plaita.ops.control import ControlListener
from plaita.ops.doctor import startup_warnings
from plaita.ops.fleetcheck import FleetCheck
from plaita.ops.histogram import observe_many
from plaita.ops.metrics import HealthServer, Metrics
from plaita.ops.registry import Registry
from plaita.ops.status import StatusFile
from plaita.runtime.worker import Worker
from plaita.store.executions.store import ExecutionStore
from plaita.store.fleet_access import FleetAccess
from plaita.store.queue_access import executions_of, waiting_starts_of
from plaita.store.stats import stream_stats
from plaita.store.streams.entries import DeadLetter

logger = logging.getLogger(__name__)

#: How often queue gauges (XLEN, pending, lag, oldest pending, DLQ) are sampled.
QUEUE_SAMPLE_EVERY_S = 5.0


class Operations:
    """The operator-facing side of one worker (a ``WorkerObserver``)."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        settings = worker.settings
        self.metrics = Metrics()
        #: The fleet's keys on the worker's client (heartbeat, fleet check, server checks).
        self.fleet = FleetAccess.of(worker.queue)
        self.registry: Registry | None = None
        self.control: ControlListener | None = None
        if settings.registry_enabled:
            self.registry, self.control = self._registry(), self._control()
        self.http: HealthServer | None = None
        if settings.metrics_port is not None:
            self.http = HealthServer(settings.metrics_host, settings.metrics_port, self.metrics, worker.readiness)
        self.status_file = StatusFile(settings.status_file, worker.status)
        self.fleet_check = FleetCheck(
            self.fleet,
            worker.queue.keyspace,
            settings.consumer_group,
            me=self._registry_entry,
            on_change=self._fleet_problem,
            share=settings.registry_enabled,
        )
        self._stop = threading.Event()
        self._monitor = threading.Thread(target=self._monitor_loop, name="plaita-monitor", daemon=True)
        self._ready_sent = False
        #: The server checks (``plaita doctor``'s) run once, on the monitor thread, after the first
        #: successful read: a worker started while Redis is down waits for it, never for them.
        self._server_checked = False
        self._server_check_due = False
        #: Labelled children of the per-task, per-execution and per-step metrics, each looked up
        #: once (``_child``): ``labels()`` costs a lock and a dict build, and these come per task.
        self._children: dict[tuple[Any, ...], Any] = {}
        #: Set for a flow worker: the suspended-executions gauge is sampled with the queue's.
        self.executions: ExecutionStore | None = None
        #: The alert webhook's events (``--alert-webhook``), or None.
        self.alerts = WorkerAlerts.of(worker, self.metrics.count_alert)
        #: Called every monitor tick while Redis answers (a flow worker records its schedules);
        #: each must be quick and never raise.
        self.periodic: list[Callable[[], object]] = []

    def _registry(self) -> Registry:
        settings = self.worker.settings
        return Registry(
            self.fleet,
            instance_id=self.worker.instance_id,
            snapshot=self._registry_entry,
            ttl_s=settings.registry_ttl_s,
            interval_s=settings.heartbeat_interval_s,
        )

    def _control(self) -> ControlListener:
        settings = self.worker.settings
        # The listener gets a client (so a pool) of its own: closing or resetting the worker's
        # pool must never tear its pub/sub connection down under it.
        control_fleet = FleetAccess.connect(
            settings.redis_url,
            socket_timeout_s=settings.socket_timeout_s,
            client_name=f"plaita-control:{settings.consumer_name}".replace(" ", "_"),
            tls=settings.tls,
        )
        return ControlListener(
            control_fleet, instance_id=self.worker.instance_id, on_command=self.worker.on_command, close_client=True
        )

    def track_executions(self) -> None:
        """This worker runs flows: sample the suspended gauge (one ZCARD per status, pipelined)."""
        self.executions = executions_of(self.worker.queue)

    def _registry_entry(self) -> dict[str, Any]:
        """The worker's status plus where its health endpoints listen: during a Redis outage the
        dashboard asks the worker itself, since the registry is exactly what cannot be read."""
        entry = self.worker.status()
        if self.http is not None:
            entry["metrics_host"] = self.worker.settings.metrics_host
            entry["metrics_port"] = self.http.port
        return entry

    def _fleet_problem(self, problem: str | None) -> None:
        if problem != self.worker.fleet_problem:
            self.worker.fleet_problem = problem
            self.status_file.write(force=True)
            if self.registry is not None:
                self.registry.beat_soon()

    # -- WorkerObserver ------------------------------------------------------------------
    def worker_started(self) -> None:
        if self.http is not None:
            self.http.start()
            logger.info(
                "metrics on http://%s:%d/metrics (/healthz, /readyz)", self.worker.settings.metrics_host, self.http.port
            )
        if self.registry is not None:
            self.registry.start()
        if self.control is not None:
            self.control.start()
        if self.alerts is not None:
            self.alerts.start()
        self._monitor.start()

    def worker_stopped(self) -> None:
        """Unregister and stop every thread (best effort, bounded)."""
        sdnotify.notify("STOPPING=1")
        self._stop.set()
        if self.alerts is not None:
            self.alerts.begin_close()  # the last events go out while the rest stops
        if self.control is not None:
            self.control.stop()
        if self.registry is not None:
            self.registry.stop()
        if self.alerts is not None:
            self.alerts.close()  # what is left of alerts.CLOSE_TIMEOUT_S, however the webhook behaves
        if self.http is not None:
            self.http.stop()
        self.metrics.up.set(0)
        self.status_file.write(force=True)

    def state_changed(self, source: State, dest: State, previous_duration_s: float) -> None:
        self.metrics.on_transition(source, dest, previous_duration_s)
        if self.registry is not None:
            self.registry.beat_soon()
        if dest is State.READING and not self._ready_sent:
            self._ready_sent = sdnotify.notify("READY=1")
        if dest is State.READING and not self._server_checked:
            self._server_check_due = True
        sdnotify.notify(f"STATUS={dest.name}")
        self.status_file.write(force=True)

    def tasks_counted(self, outcome: str, n: int) -> None:
        self._child(self.metrics.tasks, outcome).inc(n)

    def tasks_finished(self, durations_s: list[float]) -> None:
        observe_many(self.metrics.handler_seconds, durations_s)

    def redis_failed(self, kind: ErrorKind, error_name: str) -> None:
        self.metrics.redis_errors.labels(kind=kind.value, error=error_name).inc()

    def dead_lettered(self, letters: list[DeadLetter]) -> None:
        if self.alerts is not None:
            self.alerts.dead_lettered(letters)

    # -- ExecutionObserver -----------------------------------------------------------------
    def execution_event(self, flow_id: str, event: str) -> None:
        self._child(self.metrics.executions, flow_id, event).inc()

    def step_finished(self, flow_id: str, step: str, outcome: str, duration_s: float) -> None:
        self._child(self.metrics.step_seconds, flow_id, step, outcome).observe(duration_s)

    def _child(self, metric: Any, *values: str) -> Any:
        """``metric.labels(*values)``, looked up once per metric and label values (the flows and
        steps are the loaded ones, outcomes and events fixed lists: the cache is bounded)."""
        key = (id(metric), *values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return child

    def execution_failed(self, flow_id: str, execution_id: str, error: dict[str, Any] | None) -> None:
        if self.alerts is not None:
            self.alerts.execution_failed(flow_id, execution_id, error)

    def run_began(self, flow_id: str) -> None:
        self.metrics.executions_in_flight.set(self.worker.observers.executions_in_flight)

    def run_ended(self, flow_id: str) -> None:
        self.metrics.executions_in_flight.set(self.worker.observers.executions_in_flight)

    # -- periodic work -----------------------------------------------------------------
    def _monitor_loop(self) -> None:
        watchdog_s = sdnotify.watchdog_interval_s()
        next_sample = 0.0
        tick_s = min(1.0, watchdog_s) if watchdog_s else 1.0
        while not self._stop.wait(tick_s):
            self.status_file.write()
            self.metrics.in_flight.set(self.worker.in_flight)
            # Tie the systemd watchdog to the owner loop turning (reading, or retrying in
            # BACKOFF), not to process liveness: a wedged loop gets restarted, an outage does not.
            if watchdog_s and self.worker.loop_age_s() < self.worker.stall_after_s:
                sdnotify.notify("WATCHDOG=1")
            if self.alerts is not None:
                self.alerts.check_backoff()
            if not self.worker.outage.active and self.fleet_check.due():
                self.fleet_check.run()
            if not self.worker.outage.active:
                for hook in self.periodic:
                    hook()
            if self._server_check_due:
                self._check_server()
            now = time.monotonic()
            if self.http is not None and now >= next_sample:
                next_sample = now + QUEUE_SAMPLE_EVERY_S
                self._sample_queue()

    def _check_server(self) -> None:
        """Log each warning and error of the server checks once, as a WARNING (never stops the worker)."""
        self._server_check_due = False
        if self._server_checked:  # a READING that came while the check ran asked again
            return
        settings = self.worker.settings
        try:
            found = startup_warnings(self.fleet, url=settings.redis_url, partitions=settings.partitions)
        except Exception as exc:  # best effort: the worker's own loop reports what matters
            logger.debug("server check skipped: %s: %s", type(exc).__name__, exc)
            return
        if any(f.check == "connect" for f in found):
            return  # Redis went away again: checked after the next successful read
        self._server_checked = True
        for f in found:
            where = f"{f.node}: " if f.node else ""
            logger.warning(
                "Redis setting (%s %s): %s%s (see plaita doctor)", f.severity.label, f.check, where, f.message
            )

    def _sample_queue(self) -> None:
        try:
            stats = stream_stats(self.worker.queue)
        except Exception as exc:  # sampling is best effort; the next tick tries again
            logger.debug("queue sampling failed: %s", exc)
            return
        self.metrics.set_queue(stats)
        if self.executions is not None:
            try:
                suspended = self.executions.counts()["suspended"]
                waiting = waiting_starts_of(self.worker.queue)
            except Exception as exc:  # best effort, as above
                logger.debug("execution sampling failed: %s", exc)
                return
            self.metrics.executions_suspended.set(suspended)
            self.metrics.set_starts_waiting(waiting)


def attach_operations(worker: Worker) -> Operations:
    """Build the operator side of ``worker`` and attach it as an observer."""
    ops = Operations(worker)
    worker.attach(ops)
    return ops
