"""The dashboard's picture of the fleet, refreshed by a sampler thread and served from memory.

Pages never wait on Redis for the overview: a sampler thread reads the registry and the queue
statistics every second and keeps the last good picture. A Redis failure (any kind, recognised
with ``plaita.fsm.is_redis_failure``) starts an outage: the picture is kept and marked stale, a
banner says since when, and the workers' own health endpoints are asked for their live state
until Redis answers again. Nothing here ever lets an exception end the thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from plaita.dashboard import flow_figures
from plaita.dashboard.probe import MAX_PROBED, probe, probe_address
from plaita.store.errors import cause, is_redis_failure
from plaita.store.executions.store import ExecutionStore
from plaita.store.fleet_access import FleetAccess
from plaita.store.queue_access import execution_counts_of, executions_of, waiting_starts_of
from plaita.store.stats import stream_stats_or_empty
from plaita.store.streams.queue import StreamQueue

logger = logging.getLogger(__name__)

#: Seconds between registry and queue samples.
SAMPLE_EVERY_S = 1.0
#: Seconds between probes of the workers' health endpoints while Redis is unavailable.
PROBE_EVERY_S = 0.25
#: Seconds of throughput history kept and drawn.
WINDOW_S = 180.0
#: Shortest span the chart draws: a young dashboard shows its history so far, stretched to this.
MIN_SHOWN_S = 30.0
#: A worker's rate is recomputed only across heartbeats at least this far apart (less is noise).
MIN_RATE_SPAN_S = 1.0

Prober = Callable[[str, int], dict[str, Any] | None]
#: Reads the queue's figures (length, pending, lag, consumers, DLQ length, oldest pending age),
#: zeros with a note while the stream or group does not exist yet.
read_stats: Callable[[StreamQueue], dict[str, Any]] = stream_stats_or_empty


@dataclass(frozen=True)
class Outage:
    since_s: float
    error: str


class Throughput:
    """Completions per second from successive samples of each worker's ``processed`` counter.

    A worker's counter moves only when it writes its registry entry (every heartbeat and every
    state change), so each worker's rate is its counter's growth between two of its own
    heartbeats, divided by the time between them; the fleet's rate is the sum.
    """

    def __init__(self, window_s: float = WINDOW_S) -> None:
        self.window_s = window_s
        self._last: dict[str, tuple[float, int]] = {}
        self._rate: dict[str, float] = {}
        self.points: deque[tuple[float, float | None]] = deque()

    def observe(self, now_s: float, workers: list[dict[str, Any]]) -> float:
        seen: set[str] = set()
        for w in workers:
            iid = str(w.get("instance_id"))
            seen.add(iid)
            beat_s = _number(w.get("last_heartbeat"), now_s)
            processed = int(_number(w.get("processed"), 0))
            prev = self._last.get(iid)
            if prev is None or processed < prev[1]:  # new worker, or its counters restarted
                self._last[iid] = (beat_s, processed)
                self._rate.setdefault(iid, 0.0)
            elif beat_s - prev[0] >= MIN_RATE_SPAN_S:
                self._rate[iid] = (processed - prev[1]) / (beat_s - prev[0])
                self._last[iid] = (beat_s, processed)
        for gone in set(self._last) - seen:
            self._last.pop(gone, None)
            self._rate.pop(gone, None)
        rate = sum(self._rate.values())
        self._append(now_s, rate)
        return rate

    def gap(self, now_s: float) -> None:
        """No sample could be taken (Redis unavailable): the chart shows a break."""
        self._append(now_s, None)

    def _append(self, now_s: float, rate: float | None) -> None:
        self.points.append((now_s, rate))
        while self.points and self.points[0][0] < now_s - self.window_s:
            self.points.popleft()

    def current(self) -> float | None:
        return self.points[-1][1] if self.points else None


def _number(value: Any, default: float) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return default


class FleetMonitor:
    """Samples the fleet in the background; ``snapshot()`` is what the pages show."""

    def __init__(
        self,
        queue: StreamQueue,
        *,
        scrub: Callable[[str], str],
        sample_every_s: float = SAMPLE_EVERY_S,
        figures_every_s: float = flow_figures.FIGURES_EVERY_S,
        figures_store: ExecutionStore | None = None,
        prober: Prober = probe,
    ) -> None:
        self.queue = queue
        self._figures_store = figures_store or executions_of(queue)
        self._figures_every_s = figures_every_s
        self._figures: dict[str, Any] | None = None
        self._figures_at_s: float | None = None
        self._figures_error: str | None = None
        self._fleet = FleetAccess.of(queue)
        self._scrub = scrub
        self._sample_every_s = sample_every_s
        self._prober = prober
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._in_outage = threading.Event()
        self._workers: list[dict[str, Any]] = []
        self._stats: dict[str, Any] | None = None
        self._executions: dict[str, int] | None = None
        self._tenants: dict[str, Any] = {"tenants": {}, "more": 0}
        self._starts_waiting: dict[str, int] = {}
        self._outage: Outage | None = None
        self._probed: dict[str, dict[str, Any]] = {}
        self._sampled_at_s: float | None = None
        self.throughput = Throughput()
        self._threads = [
            threading.Thread(target=self._sample_loop, name="plaita-dashboard-sampler", daemon=True),
            threading.Thread(target=self._probe_loop, name="plaita-dashboard-prober", daemon=True),
        ]

    # -- threads ---------------------------------------------------------------------
    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self, timeout_s: float = 3.0) -> None:
        self._stop.set()
        for thread in self._threads:
            if thread.is_alive():
                thread.join(timeout_s)

    def _sample_loop(self) -> None:
        while not self._stop.is_set():
            self._guarded(self.sample_once)
            due = self._figures_at_s is None or time.time() - self._figures_at_s >= self._figures_every_s
            if due and not self._in_outage.is_set():
                self._guarded(self.sample_figures)
            self._stop.wait(self._sample_every_s)

    def _probe_loop(self) -> None:
        while not self._stop.is_set():
            if self._in_outage.wait(0.5) and not self._stop.is_set():
                self._guarded(self.probe_once)
                self._stop.wait(PROBE_EVERY_S)

    @staticmethod
    def _guarded(step: Callable[[], None]) -> None:
        try:
            step()
        except Exception:  # a bug must not end the thread: the page would freeze silently
            logger.exception("dashboard sampling failed (a plaita bug; please report it)")

    # -- one round -------------------------------------------------------------------
    def sample_once(self) -> None:
        """Read the registry and the queue once; on a Redis failure start (or go on with) an outage."""
        now_s = time.time()
        try:
            workers = self._fleet.workers()
            stats = read_stats(self.queue)
            counted = self._execution_counts()
        except Exception as exc:
            if not is_redis_failure(exc):
                raise
            self._fail(now_s, exc)
            return
        with self._lock:
            if self._outage is not None:
                logger.info("Redis answers again after %.1f s", now_s - self._outage.since_s)
            self._workers, self._stats, self._outage = workers, stats, None
            self._executions = counted["default"] if counted else None
            if counted:
                self._tenants = {"tenants": counted["tenants"], "more": counted["tenants_more"]}
                self._starts_waiting = counted["starts_waiting"]
            self._probed = {}
            self._sampled_at_s = now_s
            self.throughput.observe(now_s, workers)
        self._in_outage.clear()

    def _execution_counts(self) -> dict[str, Any] | None:
        """Executions by status, the default tenant's and each named tenant's (``execution_counts``),
        or None when the ACL user may not count them (rules from before the executions tab): the
        fleet and queue figures are still worth showing."""
        try:
            counted = execution_counts_of(self.queue)
            counted["starts_waiting"] = waiting_starts_of(self.queue)
            return counted
        except Exception as exc:
            if cause(exc) != "acl":
                raise
            return None

    def sample_figures(self) -> None:
        """Read the per-flow figures once (``flow_figures``). A Redis failure keeps the last ones and
        says why (the fleet's own sample decides whether Redis is down); an ACL denial (rules from
        before the executions tab) leaves them out."""
        now_s = time.time()
        with self._lock:
            starts_waiting = dict(self._starts_waiting)
        try:
            figures: dict[str, Any] | None = flow_figures.read(self._figures_store, starts_waiting, now_s)
        except Exception as exc:
            if not is_redis_failure(exc):
                raise
            with self._lock:
                if cause(exc) == "acl":
                    self._figures, self._figures_error = None, None
                else:
                    self._figures_error = self._scrub(f"{type(exc).__name__}: {exc}")
                self._figures_at_s = now_s
            return
        with self._lock:
            self._figures, self._figures_at_s, self._figures_error = figures, now_s, None

    def _fail(self, now_s: float, exc: Exception) -> None:
        with self._lock:
            if self._outage is None:
                text = self._scrub(f"{type(exc).__name__}: {exc}")
                self._outage = Outage(now_s, text)
                logger.warning("Redis unavailable (%s); showing the last known picture", text)
            self.throughput.gap(now_s)
        self._in_outage.set()

    def probe_once(self) -> None:
        """Ask each last-known worker's health endpoint for its live state (during an outage)."""
        with self._lock:
            known = list(self._workers)[:MAX_PROBED]
        results: dict[str, dict[str, Any]] = {}
        for entry in known:
            address = probe_address(entry)
            if address is None:
                continue
            answer = self._prober(*address)
            if answer is not None:
                results[str(entry.get("instance_id"))] = answer
        now_s = time.time()
        with self._lock:
            if self._outage is None:
                return  # Redis came back meanwhile: the registry is the truth again
            for iid, answer in results.items():
                before = self._probed.get(iid)
                same = before is not None and before["state"] == answer["state"]
                answer["seen_since_s"] = before["seen_since_s"] if same and before else now_s
                self._probed[iid] = answer

    # -- what the pages show -----------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        now_s = time.time()
        with self._lock:
            outage, probed = self._outage, dict(self._probed)
            rows = [_worker_row(w, probed.get(str(w.get("instance_id"))), outage, now_s) for w in self._workers]
            stats = dict(self._stats) if self._stats is not None else None
            executions = dict(self._executions) if self._executions is not None else None
            tenants = dict(self._tenants)
            starts_waiting = {f: n for f, n in self._starts_waiting.items() if n}
            figures = dict(self._figures) if self._figures is not None else None
            figures_error = self._figures_error
            points = list(self.throughput.points)
            rate = self.throughput.current()
            sampled_at_s = self._sampled_at_s
        by_state: dict[str, list[str]] = {}
        for row in rows:
            by_state.setdefault(str(row["state"]), []).append(str(row["instance_id"]))
        return {
            "now": now_s,
            "sampled_at": sampled_at_s,
            "redis": {
                "ok": outage is None and sampled_at_s is not None,
                "down_since": outage.since_s if outage else None,
                "error": outage.error if outage else None,
            },
            "workers": rows,
            "by_state": by_state,
            "stats": stats,
            "executions": executions,
            "tenant_executions": tenants,
            "starts_waiting": starts_waiting,
            "flows": figures,
            "flows_error": figures_error,
            "throughput": {
                "rate": rate,
                "points": points,
                "window_s": _shown_window_s(points, now_s, self.throughput.window_s),
            },
        }


def _shown_window_s(points: list[tuple[float, float | None]], now_s: float, window_s: float) -> float:
    """The span the chart draws: the whole window once full, else the history so far (at least MIN_SHOWN_S)."""
    if not points:
        return MIN_SHOWN_S
    return min(window_s, max(MIN_SHOWN_S, now_s - points[0][0]))


def _worker_row(
    entry: dict[str, Any], live: dict[str, Any] | None, outage: Outage | None, now_s: float
) -> dict[str, Any]:
    """One worker as the pages show it: from the registry, or from its own endpoint during an outage."""
    since = entry.get("state_since")
    state_for_s = now_s - _number(since, now_s) if since is not None else _number(entry.get("state_for_s"), 0.0)
    beat = entry.get("last_heartbeat")
    row = {
        "instance_id": str(entry.get("instance_id", "")),
        "host": str(entry.get("host", "")),
        "state": str(entry.get("state", "?")),
        "state_for_s": max(0.0, state_for_s),
        "in_flight": entry.get("in_flight"),
        "processed": entry.get("processed"),
        "failed": entry.get("failed"),
        "dead_lettered": entry.get("dead_lettered"),
        "last_error": entry.get("last_error") or "",
        "heartbeat_age_s": max(0.0, now_s - _number(beat, now_s)) if beat is not None else None,
        "ready": entry.get("ready"),
        "ready_reason": entry.get("ready_reason") or "",
        "source": "registry" if outage is None else "last known",
    }
    if live is not None:
        row.update(
            state=live["state"],
            state_for_s=max(0.0, now_s - live["seen_since_s"]),
            in_flight=live["in_flight"] if live["in_flight"] is not None else row["in_flight"],
            ready=live["ready"],
            ready_reason=live["ready_reason"],
            source="worker endpoint",
        )
    return row
