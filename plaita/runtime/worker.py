"""The worker daemon: one owner thread drives the lifecycle FSM and issues the reads.

Other threads (signals, control, handlers, the settler) never fire triggers; they post
requests (``request_stop``, ``request_pause``, a failed ack) that the owner turns into events,
so the machine has exactly one writer. The owner dispatches through a state -> action map:
every phase the worker goes through is a state of the table. No Redis error leaves ``run()``:
every one becomes ``redis_failed`` -> BACKOFF.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from plaita.config import Settings, new_instance_id
from plaita.fsm import ACTIVE_STATES, BackoffPolicy, ErrorKind, Lifecycle, State
from plaita.runtime.aio_pool import AsyncHandlerPool, is_async_handler
from plaita.runtime.consume import ConsumePhases
from plaita.runtime.counters import Counters
from plaita.runtime.inflight import InFlightTable
from plaita.runtime.intake import Intake
from plaita.runtime.observer import Observers, WorkerObserver
from plaita.runtime.outage import Outage
from plaita.runtime.outcomes import OutcomeRouter
from plaita.runtime.pool import Handler, HandlerPool, Pool
from plaita.runtime.renewer import LeaseRenewer
from plaita.runtime.settler import ACK_WINDOW, Settler
from plaita.runtime.status import worker_status
from plaita.runtime.stopping import Drainer
from plaita.store.errors import describe_failure
from plaita.store.leases import LeaseManager
from plaita.store.queue_access import leases_of, owner_leases_of
from plaita.store.streams.partitioned import open_queue
from plaita.store.streams.queue import StreamQueue

logger = logging.getLogger(__name__)

#: Longest sleep of the owner while PAUSED before it looks at its requests again.
PAUSED_POLL_S = 0.5


def describe_handler(handler: object) -> dict[str, Any]:
    """What ``handler`` runs, for the registry: ``{"flows": [...]}`` for a flow runner (or its
    bound ``run_async``: anything with ``fleet_entry()``), else ``{"handler": "module:name"}``."""
    owner = getattr(handler, "__self__", handler)
    entry = getattr(owner, "fleet_entry", None)
    if callable(entry):
        described = entry()
        if isinstance(described, dict):
            return described
    name = getattr(handler, "__qualname__", None) or type(handler).__qualname__
    return {"handler": f"{getattr(handler, '__module__', None) or type(handler).__module__}:{name}"}


#: After a stop request, how often and how long the owner's calls are cut again
#: (``Worker._cut_reads_until_seen``): a read begun just after the first cut ends within this.
STOP_CUT_EVERY_S = 0.05
STOP_CUT_FOR_S = 2.0


class Worker:
    """Consumes one stream until stopped; never exits because of Redis."""

    def __init__(self, settings: Settings, handler: Handler, *, stream_queue: StreamQueue | None = None) -> None:
        self.settings = settings
        self.instance_id = settings.instance_id or new_instance_id()
        self.queue = stream_queue if stream_queue is not None else open_queue(settings)
        self.observers = Observers()
        self.counters = Counters(self.observers)
        self.outage = Outage()
        self.lifecycle = Lifecycle(
            backoff=BackoffPolicy(
                base_s=settings.backoff_base_s, cap_s=settings.backoff_cap_s, persistent_s=settings.persistent_backoff_s
            ),
            listener=self._on_transition,
        )
        # Requests from other threads, which never fire triggers (one writer for the machine).
        # ``_stop`` becomes stop_requested at the owner's next step. ``_stop_now`` is no state:
        # it changes how STOPPING drains and must cut the drain's wait while the owner is
        # inside it, where no trigger could reach it.
        self._stop = threading.Event()
        self._stop_now = threading.Event()
        self._wake = threading.Event()
        self._slot_freed = threading.Event()
        self._requests_lock = threading.Lock()
        self._posted_failure: BaseException | None = None
        self._pause_wanted: bool | None = None
        #: Set once the owner turned the stop into stop_requested (``_cut_reads_until_seen``).
        self._stop_seen = threading.Event()
        self._cutting = False
        #: What this worker runs, published in the registry (``describe_handler``).
        self.runs = describe_handler(handler)
        #: A fleet misconfiguration the operations side found (plaita.ops.fleetcheck), or None.
        self.fleet_problem: str | None = None
        self._build_parts(handler)
        self._actions = self._action_table()
        self._last_progress_s = time.monotonic()
        self._last_step_s = self._last_progress_s
        #: No consume-loop progress for this long = stalled (not ready, no watchdog ping).
        self.stall_after_s = max(10.0, 4 * settings.socket_timeout_s, settings.read_block_ms / 1000 * 10)
        self.started = threading.Event()

    def _build_parts(self, handler: Handler) -> None:
        settings = self.settings
        self.inflight = InFlightTable()
        # A deferred hand-back holds its lease unrenewed and its entry idle: well below both limits.
        max_defer_s = min(2.0, settings.lease_ttl_s / 3, settings.claim_min_idle_ms / 3000)
        # The ack window: running tasks plus ACK_WINDOW finished ones awaiting their ack.
        self.settler = Settler(
            self.queue,
            on_failure=self._post_failure,
            max_defer_s=max_defer_s,
            on_dead=self.observers.dead_lettered,
            window=settings.concurrency + ACK_WINDOW,
        )
        self.leases = leases_of(
            self.queue, consumer=settings.consumer_name, ttl_s=settings.lease_ttl_s, lease_format=settings.lease_format
        )
        #: The owner thread acquires and releases on its own pool, which a stop may cut.
        owner_leases = owner_leases_of(self.queue, self.leases)
        self.renewer = LeaseRenewer(
            self.inflight,
            self.leases,
            self.queue,
            owner_leases=owner_leases,
            ttl_s=settings.lease_ttl_s,
            claim_min_idle_ms=settings.claim_min_idle_ms,
            on_lost=lambda _item: self.counters.add("leases_lost", 1),
        )
        self._build_phases(handler, owner_leases)

    def _action_table(self) -> dict[State, Callable[[], None]]:
        """What the owner does in each state (STOPPED ends ``run``)."""
        return {
            State.INIT: self._start,
            State.ENSURE_GROUP: self.phases.ensure_group,
            State.RESUMING_OWN: self.phases.resume_own,
            State.RECLAIMING: self.phases.reclaim,
            State.ISOLATING: self.phases.isolate,
            State.READING: self.phases.read,
            State.BACKOFF: self._wait_backoff,
            State.PAUSED: self._wait_paused,
            State.STOPPING: self._drain,
        }

    def _make_pool(self, handler: Handler) -> Pool:
        router = OutcomeRouter(
            inflight=self.inflight,
            settler=self.settler,
            counters=self.counters,
            observers=self.observers,
            slot_freed=self._slot_freed,
        )
        # Async handlers share one event loop (--concurrency coroutines); sync ones get threads.
        pool_class = AsyncHandlerPool if is_async_handler(handler) else HandlerPool
        return pool_class(
            handler,
            concurrency=self.settings.concurrency,
            max_deliveries=self.settings.max_deliveries,
            on_done=router,
            slots=self.settler,
            window=self.settler.window,
        )

    def _build_phases(self, handler: Handler, owner_leases: LeaseManager) -> None:
        settings = self.settings
        self.pool: Pool = self._make_pool(handler)
        self.intake = Intake(
            settings,
            inflight=self.inflight,
            pool=self.pool,
            settler=self.settler,
            leases=owner_leases,
            counters=self.counters,
            named=getattr(handler, "named_tasks", False) is True,
        )
        self.phases = ConsumePhases(
            settings,
            queue=self.queue,
            lifecycle=self.lifecycle,
            intake=self.intake,
            renewer=self.renewer,
            settler=self.settler,
            outage=self.outage,
            counters=self.counters,
            slot_freed=self._slot_freed,
            judges=getattr(getattr(handler, "__self__", handler), "crash_verdicts", False) is True,
        )
        self.drainer = Drainer(
            settings,
            queue=self.queue,
            pool=self.pool,
            inflight=self.inflight,
            settler=self.settler,
            counters=self.counters,
            stop_now=self._stop_now,
        )

    def attach(self, observer: WorkerObserver) -> None:
        """Add an observer (ops, a test recorder); call before ``run``."""
        self.observers.attach(observer)

    # -- requests from other threads ----------------------------------------------------
    def request_stop(self, *, now: bool = False) -> None:
        """Ask for a graceful stop; ``now`` skips the drain. Safe from any thread."""
        if now:
            self._stop_now.set()
        self._stop.set()
        self._wake.set()
        self._slot_freed.set()
        self.queue.interrupt_read()
        self._cut_reads_until_seen()

    def _cut_reads_until_seen(self) -> None:
        """Cut the owner's calls again every ``STOP_CUT_EVERY_S`` until it has seen the stop
        (left the reading states), for ``STOP_CUT_FOR_S`` at most. The cut above only reaches a
        call already on a connection: a read the owner began just after it (the stop flag
        checked, its connection not yet taken from the pool) would block for its whole BLOCK, and
        the stop would take seconds (CI saw 5.2 s with ``--read-block-ms 5000``)."""
        with self._requests_lock:
            if self._cutting:
                return
            self._cutting = True

        def cut() -> None:
            deadline = time.monotonic() + STOP_CUT_FOR_S
            while time.monotonic() < deadline and not self._stop_seen.wait(STOP_CUT_EVERY_S):
                if self.lifecycle.state in ACTIVE_STATES:
                    self.queue.interrupt_read()

        threading.Thread(target=cut, name="plaita-stop-cut", daemon=True).start()

    def request_pause(self) -> None:
        with self._requests_lock:
            self._pause_wanted = True
        self._wake.set()

    def request_resume(self) -> None:
        with self._requests_lock:
            self._pause_wanted = False
        self._wake.set()

    def _post_failure(self, exc: BaseException) -> None:
        with self._requests_lock:
            if self._posted_failure is None:
                self._posted_failure = exc
        self._wake.set()

    def _take_requests(self) -> tuple[bool | None, BaseException | None]:
        with self._requests_lock:
            pause, self._pause_wanted = self._pause_wanted, None
            failure, self._posted_failure = self._posted_failure, None
            return pause, failure

    def on_command(self, name: str, command: dict[str, Any]) -> dict[str, Any] | None:
        """A control command (on the control thread): post it; answer ``status``."""
        if name == "stop":
            # The control listener checked both are real booleans when present.
            self.request_stop(now=command.get("now") is True or command.get("graceful") is False)
        elif name == "pause":
            self.request_pause()
        elif name == "resume":
            self.request_resume()
        return {"command": name, "accepted": True, "status": self.status()}

    # -- the owner loop -----------------------------------------------------------------
    def run(self) -> int:
        """Run until stopped. Returns the process exit code (always 0: Redis never ends us)."""
        logger.info("plaita worker starting: %s", self.settings.describe())
        self.pool.start()
        self.settler.start()
        self.renewer.start()
        self.observers.worker_started()
        self.started.set()
        try:
            while self.lifecycle.state is not State.STOPPED:
                self._step()
        finally:
            self.renewer.stop()
            self.pool.stop()
            self.settler.close()
            self.observers.worker_stopped()
            self.queue.close()
        self._log_summary()
        return 0

    def _step(self) -> None:
        state = self.lifecycle.state
        self._last_step_s = time.monotonic()
        if state is not State.STOPPING and self._apply_requests(state):
            return
        try:
            self._actions[state]()
            if state in ACTIVE_STATES:
                self._last_progress_s = time.monotonic()
        except Exception as exc:
            if state not in ACTIVE_STATES:
                raise
            if self._stop.is_set():
                return  # a read cut by request_stop(); the next step fires stop_requested
            self._fail(exc, source=state.name)

    def _apply_requests(self, state: State) -> bool:
        """Turn posted requests into events (stop first, then pause/resume, then a failed ack).
        True when one fired: the next step looks at the new state."""
        if self._stop.is_set():
            fired = self.lifecycle.trigger("stop_requested")
            self._stop_seen.set()
            return fired
        pause, failure = self._take_requests()
        if pause and self.lifecycle.may_trigger("pause_requested"):
            self.lifecycle.trigger("pause_requested")
            if state is not State.PAUSED:
                logger.info("paused by remote command: no new reads; %d in-flight task(s) finish", self.in_flight)
            return True
        if pause is False and self.lifecycle.may_trigger("resume_requested"):
            logger.info("resumed by remote command")
            return self.lifecycle.trigger("resume_requested")
        if failure is not None:
            if state in ACTIVE_STATES:
                self._fail(failure, source="ack")
                return True
            self._post_failure(failure)  # handled once the owner is consuming again
        return False

    def _fail(self, exc: BaseException, *, source: str) -> None:
        failure, first = self.outage.record(exc, source)
        self.observers.redis_failed(failure.kind, type(exc).__name__)
        if failure.kind is ErrorKind.TRANSIENT:
            if first:
                logger.warning(
                    "Redis unavailable during %s (%s); backing off and retrying until it returns", source, failure.text
                )
            else:
                logger.debug("Redis still unavailable during %s (%s)", source, failure.text)
        elif failure.kind is ErrorKind.PERSISTENT:
            logger.error(
                "Redis refused %s: %s; this will not fix itself (retrying every %.0f s)",
                source,
                describe_failure(exc),
                self.settings.persistent_backoff_s,
            )
        else:
            logger.error("unexpected error during %s; backing off as for a Redis failure", source, exc_info=exc)
        self.lifecycle.trigger("redis_failed", persistent=failure.kind is not ErrorKind.TRANSIENT)

    def _start(self) -> None:
        self.lifecycle.trigger("start")

    def _wait_backoff(self) -> None:
        remaining = self.lifecycle.backoff.remaining_s()
        if remaining > 0:
            self._wake.wait(remaining)
            self._wake.clear()
        if not self._stop.is_set():
            self.lifecycle.trigger("backoff_elapsed")

    def _wait_paused(self) -> None:
        self._last_progress_s = time.monotonic()
        self._wake.wait(PAUSED_POLL_S)
        self._wake.clear()

    def _drain(self) -> None:
        self.drainer.drain()
        if not self.outage.active:  # a frozen Redis must not delay the exit
            self.phases.suspects.stopped()
        self.lifecycle.trigger("drained")

    def _on_transition(self, source: State, dest: State, trigger: str) -> None:
        level = logging.INFO if dest in (State.STOPPING, State.STOPPED, State.PAUSED) else logging.DEBUG
        logger.log(level, "state %s -> %s (%s)", source.name, dest.name, trigger)
        self.observers.state_changed(source, dest, self.lifecycle.previous_state_duration_s)

    def _log_summary(self) -> None:
        c = self.counters.snapshot()
        logger.info(
            "plaita worker stopped: %d completed, %d failed, %d dead-lettered (%d malformed), %d reclaimed, "
            "%d handed back, %d leases lost",
            *(c[k] for k in ("completed", "failed", "dead_lettered", "bad_input", "reclaimed", "handed_back")),
            c["leases_lost"],
        )

    # -- visibility -----------------------------------------------------------------------
    @property
    def in_flight(self) -> int:
        return len(self.inflight)

    @property
    def last_error(self) -> str | None:
        last = self.outage.last
        return last.text if last is not None else None

    def loop_age_s(self) -> float:
        """Seconds since the owner loop last took a step, successful or not."""
        return time.monotonic() - self._last_step_s

    def progress_age_s(self) -> float:
        """Seconds since the consume loop last completed a step."""
        return time.monotonic() - self._last_progress_s

    def readiness(self) -> tuple[bool, str]:
        """(ready, reason) from the state and the outage only (for /readyz and the status)."""
        state = self.lifecycle.state
        if state in (State.STOPPING, State.STOPPED):
            return False, "stopping"
        if state is State.PAUSED:
            return False, "paused by remote command"
        if self.outage.active or state is State.BACKOFF:
            return False, self.outage.reason()
        # Whether the worker ever got past ENSURE_GROUP is history, not a state: the machine
        # records the states it entered, so no flag beside it can disagree.
        if State.RESUMING_OWN not in self.lifecycle.visited:
            return False, "starting: consumer group not confirmed yet"
        age_s = self.progress_age_s()
        if age_s > self.stall_after_s:
            return False, f"stalled: no consume-loop progress for {age_s:.0f} s"
        if self.fleet_problem:
            return False, f"misconfigured: {self.fleet_problem}"
        return True, f"ok: {state.name}"

    def status(self) -> dict[str, Any]:
        """What the worker is doing now: the status file, the registry entry, the status reply."""
        return worker_status(self)
