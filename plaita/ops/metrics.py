"""Prometheus metrics and health endpoints (``/metrics``, ``/healthz``, ``/readyz``).

Queue gauges are sampled by the worker's monitor thread, never on scrape, so a scrape during
a Redis outage answers at once with the last known values.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from plaita.errors import ConfigError
from plaita.fsm import State

logger = logging.getLogger(__name__)

Readiness = Callable[[], tuple[bool, str]]


#: Histogram buckets of handler and step run times, in seconds: 1 ms to 30 min.
DURATION_BUCKETS_S = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 1800)


def alert_counters(r: CollectorRegistry) -> dict[str, Counter]:
    """``plaita_alerts_{sent,failed,dropped}_total`` by event: the worker's and the keeper's."""
    return {
        outcome: Counter(f"plaita_alerts_{outcome}", f"Alert webhook events {text}", ["event"], registry=r)
        for outcome, text in (
            ("sent", "delivered (2xx)"),
            ("failed", "not delivered after their retries"),
            ("dropped", "dropped: the queue was full or the process stopping"),
        )
    }


class ReplacedChildren(Collector):
    """``plaita_pool_children_replaced_total{reason}`` of ``--pool process``: read from the pool at
    each scrape (the pool counts under its own lock; nothing is pushed per replacement)."""

    def __init__(self, read: Callable[[], dict[str, int]]) -> None:
        self._read = read

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "plaita_pool_children_replaced",
            "Step child processes replaced (--pool process), by reason: died, time_limit, cancelled, "
            "max_tasks, max_memory, other",
            labels=["reason"],
        )
        for reason, n in self._read().items():
            family.add_metric([reason], n)
        yield family


class Rendered(Protocol):
    """What ``HealthServer`` serves as /metrics: the worker's ``Metrics`` or the keeper's."""

    def render(self) -> bytes: ...


class Metrics:
    """Every metric of one worker, in a registry of its own (prefix ``plaita_``)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._declare_worker(self.registry)
        self._declare_executions(self.registry)
        self._declare_queue(self.registry)
        self._declare_alerts(self.registry)
        self.up.set(1)
        for s in State:
            self.state.labels(state=s.name).set(0)

    def _declare_worker(self, r: CollectorRegistry) -> None:
        self.up = Gauge("plaita_worker_up", "1 while the worker process runs", registry=r)
        self.state = Gauge("plaita_worker_state", "1 for the current lifecycle state", ["state"], registry=r)
        # Declared before the per-label counters: the dashboard's outage probe reads only the
        # first 16 KB of /metrics, and state and in-flight must be in it however many labels follow.
        self.in_flight = Gauge("plaita_worker_in_flight", "Tasks read and not yet settled", registry=r)
        self.transitions = Counter(
            "plaita_worker_transitions", "Lifecycle transitions", ["from_state", "to_state"], registry=r
        )
        self.backoff_seconds = Counter("plaita_worker_backoff_seconds", "Seconds spent in BACKOFF", registry=r)
        self.redis_errors = Counter(
            "plaita_redis_errors", "Redis errors by kind and class", ["kind", "error"], registry=r
        )
        self.tasks = Counter("plaita_tasks", "Tasks by outcome", ["outcome"], registry=r)
        self.handler_seconds = Histogram(
            "plaita_handler_duration_seconds",
            "Handler run time",
            buckets=DURATION_BUCKETS_S,
            registry=r,
        )

    def _declare_executions(self, r: CollectorRegistry) -> None:
        self.executions = Counter(
            "plaita_executions",
            "Flow executions started here, or checkpointed here as suspended/completed/failed/cancelled",
            ["flow", "event"],
            registry=r,
        )
        self.step_seconds = Histogram(
            "plaita_step_duration_seconds",
            "Flow step run time (until it returned, suspended or raised; the checkpoint excluded)",
            ["flow", "step", "outcome"],
            buckets=DURATION_BUCKETS_S,
            registry=r,
        )
        self.executions_in_flight = Gauge(
            "plaita_executions_in_flight", "Executions this worker is advancing now", registry=r
        )
        self.executions_suspended = Gauge(
            "plaita_executions_suspended",
            "Suspended executions of every worker (sampled from the status index)",
            registry=r,
        )

        self.starts_waiting = Gauge(
            "plaita_flow_starts_waiting",
            "Starts of a max_concurrent flow parked until one of its slots is free (sampled)",
            ["flow"],
            registry=r,
        )

    def set_starts_waiting(self, waiting: dict[str, int]) -> None:
        for flow_id, n in waiting.items():
            self.starts_waiting.labels(flow=flow_id).set(n)

    def _declare_queue(self, r: CollectorRegistry) -> None:
        self.queue_length = Gauge("plaita_queue_stream_length", "Entries in the stream (XLEN)", registry=r)
        self.queue_pending = Gauge("plaita_queue_pending", "Entries delivered and not acked (group PEL)", registry=r)
        self.queue_lag = Gauge("plaita_queue_lag", "Entries not yet delivered to the group", registry=r)
        self.oldest_pending_age = Gauge(
            "plaita_queue_oldest_pending_age_seconds", "Age of the oldest pending entry", registry=r
        )
        self.dlq_length = Gauge("plaita_queue_dlq_length", "Entries in the dead-letter stream", registry=r)
        self.delayed = Gauge("plaita_queue_delayed", "Delayed tasks not yet due (not on the stream)", registry=r)

    def _declare_alerts(self, r: CollectorRegistry) -> None:
        self.alerts = alert_counters(r)

    def track_pool(self, replacements: Callable[[], dict[str, int]]) -> None:
        """Expose the process pool's replaced children (``ProcessPool.replacements``)."""
        self.registry.register(ReplacedChildren(replacements))

    def count_alert(self, outcome: str, event: str) -> None:
        self.alerts[outcome].labels(event=event).inc()

    def on_transition(self, source: State, dest: State, seconds_in_source: float) -> None:
        self.state.labels(state=source.name).set(0)
        self.state.labels(state=dest.name).set(1)
        self.transitions.labels(from_state=source.name, to_state=dest.name).inc()
        if source is State.BACKOFF:
            self.backoff_seconds.inc(seconds_in_source)

    def set_queue(self, stats: dict[str, Any]) -> None:
        self.queue_length.set(stats.get("length", 0))
        self.queue_pending.set(stats.get("pending", 0))
        lag = stats.get("lag")
        if lag is not None:
            self.queue_lag.set(lag)
        self.oldest_pending_age.set(stats.get("oldest_pending_age_s", 0.0))
        self.dlq_length.set(stats.get("dlq_length", 0))
        if stats.get("delayed") is not None:  # None: the user may not count them
            self.delayed.set(stats["delayed"])

    def render(self) -> bytes:
        return generate_latest(self.registry)


class HealthServer:
    """A small HTTP server: /metrics, /healthz (process up), /readyz (consuming or 503 + reason)."""

    def __init__(self, host: str, port: int, metrics: Rendered, readiness: Readiness) -> None:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer._serve(self)

            def log_message(self, format: str, *args: Any) -> None:
                logger.debug("http: " + format, *args)

        self._metrics = metrics
        self._readiness = readiness
        try:
            self.httpd = ThreadingHTTPServer((host, port), Handler)
        except (OSError, OverflowError) as exc:  # port in use, an address this host lacks, bad port
            # A bad flag, not a crash: one line and exit 2 from the CLI instead of a traceback.
            reason = getattr(exc, "strerror", None) or exc
            raise ConfigError(f"cannot listen on --metrics-host {host!r} --metrics-port {port}: {reason}") from None
        self.httpd.daemon_threads = True
        self.port = int(self.httpd.server_address[1])
        # A short poll interval keeps shutdown() (and so an idle worker's exit) fast.
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="plaita-http", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def _serve(self, req: BaseHTTPRequestHandler) -> None:
        path = req.path.split("?", 1)[0]
        if path == "/metrics":
            self._send(req, 200, self._metrics.render(), CONTENT_TYPE_LATEST)
        elif path == "/healthz":
            self._send(req, 200, b"ok\n", "text/plain; charset=utf-8")
        elif path == "/readyz":
            ready, reason = self._readiness()
            self._send(req, 200 if ready else 503, f"{reason}\n".encode(), "text/plain; charset=utf-8")
        else:
            self._send(req, 404, b"not found: try /metrics, /healthz or /readyz\n", "text/plain; charset=utf-8")

    @staticmethod
    def _send(req: BaseHTTPRequestHandler, code: int, body: bytes, content_type: str) -> None:
        req.send_response(code)
        req.send_header("Content-Type", content_type)
        req.send_header("Content-Length", str(len(body)))
        req.end_headers()
        req.wfile.write(body)
