"""The standalone keeper's Prometheus metrics and readiness (``plaita keeper --metrics-port``).

The keeper tells them every pass and every failed full pass (``Keeper.on_pass`` /
``on_failure``); a scrape only renders what was counted, so it answers at once during a Redis
outage. Readiness says whether the last full pass went through: a keeper that cannot reach
Redis (or is refused by it) is not ready, with the reason, and it is ready again after the next
pass that works; a keeper on standby (another one holds ``plaita:keeper:lease``) is ready.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from plaita.flows.keeper.keeper_types import KeeperPass
from plaita.ops.metrics import alert_counters

#: Keeper pass durations, in seconds: 1 ms to 5 min (a full pass reads the stream).
PASS_BUCKETS_S = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300)
#: What a pass did -> ``plaita_keeper_actions_total{action=...}``.
ACTIONS = {
    "timeouts": "timeout",
    "retries": "retry",
    "orphaned": "orphaned",
    "wakes": "wake",
    "scheduled": "scheduled",
    "expired": "deadline_cancel",
    "corrupt": "corrupt_skipped",
}
#: Longest error text kept for /readyz.
MAX_REASON_CHARS = 200


class KeeperMetrics:
    """Every metric of one keeper process, in a registry of its own, and its readiness."""

    def __init__(self, clock_s: Callable[[], float] = time.time, *, registry: CollectorRegistry | None = None) -> None:
        """``registry``: a worker's, for a keeper embedded in it (``--keeper``): its passes show on
        the worker's /metrics, and its alerts already count there. None = a registry of its own."""
        self._clock_s = clock_s
        self._lock = threading.Lock()
        own = registry is None
        r = self.registry = CollectorRegistry() if registry is None else registry
        self.up = Gauge("plaita_keeper_up", "1 while the keeper process runs", registry=r)
        self.acting = Gauge(
            "plaita_keeper_acting", "1 while this keeper holds plaita:keeper:lease and acts, 0 on standby", registry=r
        )
        self.passes = Counter(
            "plaita_keeper_passes",
            "Passes that went through, by kind (full, deadlines) and role (acting, standby)",
            ["kind", "role"],
            registry=r,
        )
        self.failures = Counter(
            "plaita_keeper_pass_failures",
            "Full passes that failed (Redis down or refusing), by error class",
            ["error"],
            registry=r,
        )
        self.actions = Counter("plaita_keeper_actions", "What the acting keeper did, by action", ["action"], registry=r)
        self.duration = Histogram(
            "plaita_keeper_pass_duration_seconds", "Pass run time", ["kind"], buckets=PASS_BUCKETS_S, registry=r
        )
        self.last_success = Gauge(
            "plaita_keeper_last_success_timestamp_seconds", "When the last full pass went through (epoch)", registry=r
        )
        self.alerts = alert_counters(r) if own else {}
        self.up.set(1)
        for action in ACTIONS.values():
            self.actions.labels(action=action)  # every action shown, at 0 until it happens
        self._ready: tuple[bool, str] = (False, "starting: no keeper pass yet")
        self._failing_since_s: float | None = None

    def on_pass(self, report: KeeperPass) -> None:
        kind = "full" if report.full else "deadlines"
        self.passes.labels(kind=kind, role="acting" if report.acting else "standby").inc()
        self.duration.labels(kind=kind).observe(report.duration_s)
        self.acting.set(1 if report.acting else 0)
        for name, action in ACTIONS.items():
            done = len(getattr(report, name))
            if done:
                self.actions.labels(action=action).inc(done)
        if not report.full:
            return
        self.last_success.set(self._clock_s())
        reason = "acting" if report.acting else "standby: another keeper holds plaita:keeper:lease"
        with self._lock:
            self._ready, self._failing_since_s = (True, reason), None

    def on_failure(self, exc: BaseException) -> None:
        self.failures.labels(error=type(exc).__name__).inc()
        self.acting.set(0)
        now_s = self._clock_s()
        with self._lock:
            since_s = self._failing_since_s = self._failing_since_s or now_s
            text = f"{type(exc).__name__}: {exc}"[:MAX_REASON_CHARS]
            self._ready = (False, f"keeper passes failing for {now_s - since_s:.0f} s: {text}")

    def count_alert(self, outcome: str, event: str) -> None:
        self.alerts[outcome].labels(event=event).inc()

    def readiness(self) -> tuple[bool, str]:
        with self._lock:
            return self._ready

    def render(self) -> bytes:
        return generate_latest(self.registry)
