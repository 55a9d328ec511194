"""The worker daemon: one owner thread drives the lifecycle FSM and issues the reads.

Other threads (signals, handlers, the settler) never fire triggers; they post requests
(``request_stop``, ``_post_failure``) that the owner turns into events (design.md §3 rule 5).
No Redis error leaves ``run()``: every one becomes ``redis_failed`` -> BACKOFF.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

from plaita import __version__
from plaita.config import DEFAULT_MAX_PREFETCH, READ_BATCH_MAX, Settings
from plaita.errors import BadTaskError
from plaita.fsm import BackoffPolicy, ErrorKind, Lifecycle, State, classify
from plaita.ops.operations import Operations, registry_status
from plaita.ops.registry import host_label, new_instance_id
from plaita.runtime.pool import ACK, DEAD, Done, Handler, HandlerPool, Outcome, Settler
from plaita.runtime.renewer import InFlight, InFlightTable, LeaseKeeper
from plaita.store.leases import LEASE_PREFIX, LeaseManager
from plaita.store.streams import Entry, StreamQueue
from plaita.tasks import Task, parse_entry

logger = logging.getLogger(__name__)

#: Entries claimed per RECLAIMING pass at most, so a huge pending list never starves reading.
RECLAIM_BATCH = 100
#: Handlers faster than this (mean) let the worker read ahead (automatic prefetch).
FAST_HANDLER_S = 0.005
#: Longest wait for pending acks to reach Redis while stopping.
STOP_FLUSH_TIMEOUT_S = 1.0
#: How often the status file is rewritten at most.
STATUS_EVERY_S = 1.0
#: Entries examined per residue sweep (original #43: 256 per pass).
RESIDUE_SWEEP_BATCH = 256
#: Below this claim threshold every task takes its lease before it starts (see _accept).
LAZY_LEASE_MIN_IDLE_MS = 1000
#: Longest wait for the hand-back transaction while stopping.
HAND_BACK_TIMEOUT_S = 1.0


@dataclass
class Counters:
    """Per-process task counters (the shutdown summary and the status file)."""

    read: int = 0
    reclaimed: int = 0
    completed: int = 0
    failed: int = 0
    dead_lettered: int = 0
    bad_input: int = 0
    lease_conflicts: int = 0
    leases_lost: int = 0
    handed_back: int = 0


class Worker:
    """Consumes one stream until stopped; never exits because of Redis."""

    def __init__(self, settings: Settings, handler: Handler, *, stream_queue: StreamQueue | None = None) -> None:
        self.settings = settings
        self.instance_id = settings.instance_id or new_instance_id()
        self.queue = stream_queue if stream_queue is not None else StreamQueue.from_settings(settings)
        self.counters = Counters()
        self.last_error: str | None = None
        self.lifecycle = Lifecycle(
            backoff=BackoffPolicy(
                base_s=settings.backoff_base_s,
                cap_s=settings.backoff_cap_s,
                persistent_s=settings.persistent_backoff_s,
            ),
            listener=self._on_transition,
        )
        self._pool = HandlerPool(
            handler,
            concurrency=settings.concurrency,
            max_deliveries=settings.max_deliveries,
            on_done=self._on_tasks_done,
        )
        self.leases = LeaseManager(self.queue.client, consumer=settings.consumer_name, ttl_s=settings.lease_ttl_s)
        self._inflight = InFlightTable()
        #: Lazy message-id leases rely on idle time < claim_min_idle_ms until the first renewal
        #: (at most 2/3 of it); with a threshold this short, take every lease eagerly instead.
        self._eager_leases = settings.eager_leases or settings.claim_min_idle_ms < LAZY_LEASE_MIN_IDLE_MS
        self.keeper = LeaseKeeper(
            self._inflight,
            self.leases,
            self.queue,
            ttl_s=settings.lease_ttl_s,
            claim_min_idle_ms=settings.claim_min_idle_ms,
            on_lost=lambda _item: self._count("leases_lost", 1),
        )
        self._settler = Settler(self.queue, on_failure=self._post_failure)
        self._stop = threading.Event()
        self._stop_now = threading.Event()
        self._wake = threading.Event()
        self._slot_freed = threading.Event()
        self._failure_lock = threading.Lock()
        self._posted_failure: BaseException | None = None
        self._own_pending_done = False
        self._own_cursor = "0"
        self._claim_cursor = "0-0"
        self._next_reclaim_at_s = 0.0
        self._next_housekeeping_at_s = 0.0
        self._outage_since_s: float | None = None
        self._outage_retries = 0
        self._group_seen = False
        self._counter_lock = threading.Lock()
        self._pause_wanted: bool | None = None
        self._last_progress_s = time.monotonic()
        self._last_step_s = self._last_progress_s
        self._last_failure: tuple[ErrorKind, BaseException] | None = None
        #: No consume-loop progress for this long = stalled (not ready, no watchdog ping).
        self.stall_after_s = max(10.0, 4 * settings.socket_timeout_s, settings.read_block_ms / 1000 * 10)
        self.started = threading.Event()
        self.ops = Operations(self)

    # -- requests from other threads ----------------------------------------------------
    def request_stop(self, *, now: bool = False) -> None:
        """Ask for a graceful stop; ``now`` skips the drain. Safe from any thread."""
        if now:
            self._stop_now.set()
        self._stop.set()
        self._wake.set()
        self._slot_freed.set()
        self.queue.interrupt_read()

    @property
    def stop_requested(self) -> bool:
        return self._stop.is_set()

    def _post_failure(self, exc: BaseException) -> None:
        with self._failure_lock:
            if self._posted_failure is None:
                self._posted_failure = exc
        self._wake.set()

    def _take_posted_failure(self) -> BaseException | None:
        with self._failure_lock:
            exc, self._posted_failure = self._posted_failure, None
            return exc

    # -- the owner loop -----------------------------------------------------------------
    def run(self) -> int:
        """Run until stopped. Returns the process exit code (always 0: Redis never ends us)."""
        logger.info("plaita worker starting: %s", self.settings.describe())
        self._pool.start()
        self._settler.start()
        self.keeper.start()
        self.ops.start()
        self.lifecycle.trigger("start")
        self.started.set()
        try:
            while self.lifecycle.state is not State.STOPPED:
                self._step()
        finally:
            self.keeper.stop()
            self._pool.stop()
            self._settler.close()
            self.ops.stop()
            self.queue.close()
        c = self.counters
        logger.info(
            "plaita worker stopped: %d completed, %d failed, %d dead-lettered (%d malformed), %d reclaimed, "
            "%d handed back, %d leases lost",
            c.completed,
            c.failed,
            c.dead_lettered,
            c.bad_input,
            c.reclaimed,
            c.handed_back,
            c.leases_lost,
        )
        return 0

    def _step(self) -> None:
        state = self.lifecycle.state
        self._last_step_s = time.monotonic()
        if state is State.STOPPING:
            self._drain()
            self.lifecycle.trigger("drained")
            return
        if self._stop.is_set():
            self.lifecycle.trigger("stop_requested")
            return
        if self._pause_wanted is not None and self._apply_pause(state):
            return
        if state is State.PAUSED:
            self._last_progress_s = time.monotonic()
            self._wake.wait(0.5)
            self._wake.clear()
            return
        if state is State.BACKOFF:
            self._wait_backoff()
            return
        posted = self._take_posted_failure()
        if posted is not None:
            self._fail(posted, source="ack")
            return
        try:
            if state is State.ENSURE_GROUP:
                self._ensure_group()
            elif state is State.RECLAIMING:
                self._reclaim()
            elif state is State.READING:
                self._read()
            self._last_progress_s = time.monotonic()
        except Exception as exc:
            if self._stop.is_set():
                return  # a read cut by request_stop(); the next step fires stop_requested
            self._fail(exc, source=state.name)

    def _apply_pause(self, state: State) -> bool:
        """Turn a posted pause/resume request into its event; True if one fired."""
        want, self._pause_wanted = self._pause_wanted, None
        if want and self.lifecycle.may_trigger("pause_requested") and state is not State.PAUSED:
            logger.info("paused by remote command: no new reads; %d in-flight task(s) finish", self.in_flight)
            return self.lifecycle.trigger("pause_requested")
        if want is False and state is State.PAUSED:
            logger.info("resumed by remote command")
            return self.lifecycle.trigger("resume_requested")
        return False

    def _fail(self, exc: BaseException, *, source: str) -> None:
        kind = classify(exc)
        self._last_failure = (kind, exc)
        self.ops.metrics.redis_errors.labels(kind=kind.value, error=type(exc).__name__).inc()
        desc = f"{type(exc).__name__}: {exc}"
        self.last_error = desc[:300]
        now = time.monotonic()
        if kind is ErrorKind.TRANSIENT:
            if self._outage_since_s is None:
                self._outage_since_s, self._outage_retries = now, 0
                logger.warning(
                    "Redis unavailable during %s (%s); backing off and retrying until it returns", source, desc
                )
            else:
                self._outage_retries += 1
                logger.debug("Redis still unavailable during %s (%s)", source, desc)
        else:
            if self._outage_since_s is None:
                self._outage_since_s, self._outage_retries = now, 0
            else:
                self._outage_retries += 1
            if kind is ErrorKind.PERSISTENT:
                logger.error(
                    "Redis refused %s (%s); this will not fix itself: check credentials, ACL and key types "
                    "(retrying every %.0f s)",
                    source,
                    desc,
                    self.settings.persistent_backoff_s,
                )
            else:
                logger.error("unexpected error during %s; backing off as for a Redis failure", source, exc_info=exc)
        self.lifecycle.trigger("redis_failed", persistent=kind is not ErrorKind.TRANSIENT)

    def _wait_backoff(self) -> None:
        remaining = self.lifecycle.backoff.remaining_s()
        if remaining > 0:
            self._wake.wait(remaining)
            self._wake.clear()
        if not self._stop.is_set():
            self.lifecycle.trigger("backoff_elapsed")

    def _ensure_group(self) -> None:
        created = self.queue.ensure_group()
        if created and self._group_seen:
            logger.warning(
                "consumer group %r on %r was missing (Redis restarted without its data?); recreated it",
                self.queue.group,
                self.queue.stream,
            )
        elif created:
            logger.info("created consumer group %r on stream %r", self.queue.group, self.queue.stream)
        self._group_seen = True
        if self._outage_since_s is not None:
            logger.info(
                "Redis is back after %.1f s (%d retries); consuming again",
                time.monotonic() - self._outage_since_s,
                self._outage_retries,
            )
            self._outage_since_s = None
            self.last_error = None
            # A read sent just before the outage may have been executed by Redis with its reply
            # lost: those entries sit in our pending list. Re-scan it now instead of leaving them
            # to a reclaim after claim_min_idle_ms. Work still running or awaiting its ack holds
            # its lease, so the scan skips it (a lease of this incarnation is never taken over).
            if self._own_pending_done:
                self._own_pending_done, self._own_cursor = False, "0"
        self._last_failure = None
        self._settler.redis_ok()
        self.lifecycle.trigger("group_ready")

    def _reclaim(self) -> None:
        """One bounded pass: claim abandoned entries (idle and unleased), then housekeeping."""
        self.keeper.release_orphans()
        budget = min(self._free_slots(), RECLAIM_BATCH)
        # Claim only after the one-time scan of our own pending list: a claimed entry joins that
        # list, and the scan (from id 0) would dispatch it again once it finished but before its
        # ack landed -- a duplicate execution. ``_read`` makes the first claim pass follow the scan.
        if budget > 0 and self._own_pending_done:
            ours = self._ours()
            cursor, claimed, skipped = self.queue.claim_unleased(
                self._claim_cursor, self.settings.claim_min_idle_ms, budget, LEASE_PREFIX
            )
            self._claim_cursor = cursor
            # Our own finished work whose ack is still queued (say, across an outage) may look
            # abandoned: claimed back to us is harmless, running it again is not.
            claimed = [e for e in claimed if e.message_id not in ours]
            if skipped:
                logger.debug("reclaim skipped %d idle entries whose executions are still leased", skipped)
            if claimed:
                logger.info(
                    "reclaimed %d abandoned task(s): %s",
                    len(claimed),
                    ", ".join(f"{e.message_id} (delivery {e.delivery_count})" for e in claimed[:10]),
                )
                self._count("reclaimed", self._accept(claimed))
        now = time.monotonic()
        if now >= self._next_housekeeping_at_s:
            self._housekeeping()
            self._next_housekeeping_at_s = now + self.settings.housekeeping_interval_s
        self._next_reclaim_at_s = now + self.settings.reclaim_interval_s
        self.lifecycle.trigger("reclaim_done")

    def _housekeeping(self) -> None:
        """Remove long-idle consumers with nothing pending, and acked-but-undeleted residue."""
        removed = self.queue.prune_consumers(int(self.settings.consumer_prune_idle_s * 1000))
        if removed:
            logger.info("removed %d idle consumer(s) with no pending entries: %s", len(removed), ", ".join(removed))
        swept = self.queue.sweep_residue(RESIDUE_SWEEP_BATCH)
        if swept:
            logger.info("deleted %d acked entries left in the stream (residue)", swept)

    def _read(self) -> None:
        if time.monotonic() >= self._next_reclaim_at_s:
            self.lifecycle.trigger("reclaim_due")
            return
        free = self._free_slots()
        if free <= 0:
            self._slot_freed.wait(self.settings.read_block_ms / 1000)
            self._slot_freed.clear()
            return
        if not self._own_pending_done:
            # A restarted worker with a stable name resumes its own pending entries at once. After
            # an outage the same scan finds entries whose read reply was lost. Work of ours still
            # running or awaiting its ack is skipped: the snapshot is taken *before* the read, and
            # an id is always in one of the two sets until its ack lands (put before forget).
            ours = self._ours()
            page = self.queue.read_own_pending(self._own_cursor, free)
            if not page:
                self._own_pending_done = True
                self._next_reclaim_at_s = 0.0  # the claim pass skipped until now runs at once
                return
            self._own_cursor = page[-1].message_id
            entries = [e for e in page if e.message_id not in ours]
            if entries:
                logger.info("resuming %d of this consumer's own pending tasks", len(entries))
        else:
            entries = self.queue.read_new(free, self.settings.read_block_ms)
        self.lifecycle.backoff.reset()
        self._accept(entries)

    def _ours(self) -> set[str]:
        """Ids of work still running here or awaiting its ack. Take it *before* reading: an id
        is in one of the two sets until its ack lands (the outcome is queued before the task
        leaves the in-flight table), so nothing read afterwards can slip between them."""
        return self._inflight.ids() | self._settler.unsettled_ids()

    def _free_slots(self) -> int:
        prefetch = self.settings.prefetch
        if prefetch is None:
            mean = self._pool.mean_duration_s
            prefetch = DEFAULT_MAX_PREFETCH if mean is not None and mean < FAST_HANDLER_S else 0
        busy = len(self._inflight)
        return min(READ_BATCH_MAX, self.settings.concurrency + prefetch - busy)

    def _accept(self, entries: list[Entry]) -> int:
        """Dispatch a read batch: malformed entries go straight to the DLQ, the rest start.

        A task of an execution (body ``execution_id``) starts only once it holds that
        execution's lease (one round trip for the batch), so a start and a resume of the same
        execution never run at once. A task without one is keyed by its own message id, which
        no other entry shares: it starts at once and takes its lease only if it is still running
        at the first renewal (``LeaseKeeper.renew_once``). Until then its idle time, reset by the read, is
        below ``claim_min_idle_ms``, so no reclaim can take it: the same protection, without a
        Lua call per short task. Returns how many started.
        """
        eager: list[tuple[Task, Entry]] = []
        started: list[Task] = []
        now = time.monotonic()
        for entry in entries:
            task = self._parse(entry)
            if task is None:
                continue
            if self._eager_leases or "execution_id" in task.body:
                eager.append((task, entry))
                continue
            assert entry.fields is not None
            self._inflight.add(InFlight(task, entry.fields, None, now, read_at_s=now))
            started.append(task)
        try:
            leases = self.leases.acquire_many([t.execution_id for t, _ in eager])
        except Exception:
            # Redis may have set some of these leases anyway: released as orphans after the
            # outage; the entries stay in our pending list and are re-read then.
            self._inflight.suspect_orphans(t.execution_id for t, _ in eager)
            self._pool.submit(started)
            raise
        for (task, entry), got in zip(eager, leases, strict=True):
            if isinstance(got, str):
                self._count("lease_conflicts", 1)
                logger.info(
                    "execution %s is leased by %s; task %s left pending until that lease ends",
                    task.execution_id,
                    got,
                    task.message_id,
                )
                continue
            task.fencing_token = got.generation
            assert entry.fields is not None
            self._inflight.add(InFlight(task, entry.fields, got, now, read_at_s=now))
            started.append(task)
        self._pool.submit(started)
        self._count("read", len(started))
        return len(started)

    def _parse(self, entry: Entry) -> Task | None:
        """The entry as a runnable task, or None (dead-lettered, deleted, or already running)."""
        if entry.fields is None:
            self._settler.put(Outcome(entry.message_id))  # deleted from the stream: clear the PEL
            return None
        if entry.message_id in self._inflight:
            return None  # already running here (our own idle entry came back)
        try:
            task = parse_entry(
                entry.message_id,
                entry.fields,
                entry.delivery_count,
                max_payload_bytes=self.settings.max_payload_bytes,
            )
        except BadTaskError as exc:
            self._count("bad_input", 1)
            logger.warning("task %s is malformed (%s): moved to the DLQ", entry.message_id, exc.reason)
            self._dead_letter(entry, exc.reason, None)
            return None
        if task.delivery_count > self.settings.max_deliveries:
            logger.error(
                "task %s was delivered %d times without success: moved to the DLQ", task.message_id, task.delivery_count
            )
            self._dead_letter(entry, "max_deliveries", task.body)
            return None
        return task

    def _dead_letter(self, entry: Entry, reason: str, body: Any) -> None:
        self._count("dead_lettered", 1)
        payload = StreamQueue.payload_for_dlq(entry, body)
        self._settler.put(Outcome.to_dlq(entry.message_id, reason, entry.delivery_count, payload))

    def _on_tasks_done(self, done: list[Done]) -> None:
        """Called on a handler thread with the tasks it finished (a chunk, in order)."""
        histogram = self.ops.metrics.handler_seconds
        # Marked settling before the settler can release their leases (see LeaseKeeper).
        items = self._inflight.begin_settling(task.message_id for task, _, _ in done)
        outcomes: list[Outcome] = []
        counts = {"completed": 0, "failed": 0, "dead_lettered": 0}
        for (task, outcome, duration_s), item in zip(done, items, strict=True):
            histogram.observe(duration_s)
            if item is not None and item.lost:
                # A successor may own this entry now: acking or releasing would touch its delivery.
                logger.warning(
                    "task %s finished after it was handed back or lost its lease; not acked (its successor decides)",
                    task.message_id,
                )
                continue
            if outcome.kind == ACK:
                counts["completed"] += 1
            else:
                counts["failed"] += 1
                counts["dead_lettered"] += outcome.kind == DEAD
            lease = item.lease if item is not None else None
            if lease is not None:
                outcome = Outcome(outcome.message_id, outcome.kind, outcome.dead, (lease.key, lease.value))
            outcomes.append(outcome)
        for name, n in counts.items():
            self._count(name, n)
        # Settler first, then out of the in-flight map: at every instant the id is in one of the
        # two, so no scan of our own pending list can mistake finished work for abandoned work.
        self._settler.put_many(outcomes)
        self._inflight.pop(task.message_id for task, _, _ in done)
        self._slot_freed.set()

    # -- stopping -----------------------------------------------------------------------
    def _drain(self) -> None:
        unstarted = self._pool.take_unstarted()
        unstarted_items = self._inflight.pop(t.message_id for t in unstarted)
        running = self._pool.busy
        if running:
            logger.info(
                "stopping: draining %d running task(s), up to %.1f s (signal again to stop now)",
                running,
                self.settings.drain_timeout_s,
            )
        # Hand back unstarted work at once so other workers need not wait for the drain.
        self._hand_back(unstarted_items, "read but not started")
        deadline = time.monotonic() + self.settings.drain_timeout_s
        idle = self._pool.wait_idle(deadline, self._stop_now)
        if not idle:
            left = self._inflight.abandon_all()  # a late finish must not ack: handed back
            logger.warning("drain ended with %d task(s) still running", len(left))
            self._hand_back(left, "still running at the drain deadline")
        self._settler.close()
        # Bounded by what is left of the drain, so a frozen Redis cannot stretch the exit.
        flush_s = max(0.25, min(STOP_FLUSH_TIMEOUT_S, deadline - time.monotonic()))
        if not self._settler.flush(flush_s):
            logger.warning(
                "%d ack(s) could not reach Redis before exit; those tasks will be redelivered", self._settler.backlog
            )

    def _hand_back(self, items: list[InFlight], what: str) -> None:
        """Give tasks back to the group without charging a delivery (best effort)."""
        if not items:
            return
        entries = [(i.task.message_id, i.fields) for i in items]
        releases = [(i.lease.key, i.lease.value) for i in items if i.lease is not None]
        try:
            self.queue.hand_back(entries, releases)
        except Exception as exc:
            logger.warning(
                "could not hand back %d task(s) %s (%s: %s); they stay pending for this consumer",
                len(items),
                what,
                type(exc).__name__,
                exc,
            )
            return
        self._count("handed_back", len(items))
        logger.info("handed back %d task(s) %s", len(items), what)

    # -- visibility and remote control ------------------------------------------------
    def _count(self, name: str, n: int = 1) -> None:
        if n:
            with self._counter_lock:
                setattr(self.counters, name, getattr(self.counters, name) + n)
            self.ops.count(name, n)

    @property
    def in_flight(self) -> int:
        return len(self._inflight)

    def loop_age_s(self) -> float:
        """Seconds since the owner loop last took a step, successful or not."""
        return time.monotonic() - self._last_step_s

    def progress_age_s(self) -> float:
        """Seconds since the consume loop last completed a step."""
        return time.monotonic() - self._last_progress_s

    def readiness(self) -> tuple[bool, str]:
        """(ready, reason): ready only while consuming and making progress (for /readyz)."""
        state = self.lifecycle.state
        if state in (State.STOPPING, State.STOPPED):
            return False, "stopping"
        if state is State.PAUSED:
            return False, "paused by remote command"
        if state is State.BACKOFF or self._last_failure is not None:
            if self._last_failure is None:
                return False, "backoff"
            kind, exc = self._last_failure
            name = type(exc).__name__
            text = f"{name}: {exc}"
            if name in ("AuthenticationError", "AuthorizationError") or str(exc).startswith(("WRONGPASS", "NOAUTH")):
                return False, f"auth: {text}"
            if str(exc).startswith("NOPERM"):
                return False, f"acl: {text}"
            return False, f"redis {kind.value} failure: {text}"
        if state is State.INIT or not self._group_seen:
            return False, "starting: consumer group not confirmed yet"
        age_s = self.progress_age_s()
        if age_s > self.stall_after_s:
            return False, f"stalled: no consume-loop progress for {age_s:.0f} s"
        return True, f"ok: {state.name}"

    def request_pause(self) -> None:
        self._pause_wanted = True
        self._wake.set()

    def request_resume(self) -> None:
        self._pause_wanted = False
        self._wake.set()

    def on_command(self, name: str, command: dict[str, Any]) -> dict[str, Any] | None:
        """A control command (on the control thread): post it; answer ``status``."""
        if name == "stop":
            self.request_stop(now=bool(command.get("now")) or command.get("graceful") is False)
        elif name == "pause":
            self.request_pause()
        elif name == "resume":
            self.request_resume()
        return {"command": name, "accepted": True, "status": self.status()}

    def _on_transition(self, source: State, dest: State, trigger: str) -> None:
        level = logging.INFO if dest in (State.STOPPING, State.STOPPED, State.PAUSED) else logging.DEBUG
        logger.log(level, "state %s -> %s (%s)", source.name, dest.name, trigger)
        self.ops.on_transition(source, dest)

    def status(self) -> dict[str, Any]:
        """What the worker is doing now: the status file, the registry entry, the status reply."""
        state = self.lifecycle.state
        with self._counter_lock:
            counters = asdict(self.counters)
        ready, reason = self.readiness()
        return {
            "instance_id": self.instance_id,
            "service_type": "flow_worker",
            "host": host_label(),
            "pid": os.getpid(),
            "version": __version__,
            "consumer": self.settings.consumer_name,
            "stream": self.settings.queue_name,
            "group": self.settings.consumer_group,
            "status": registry_status(state),
            "state": state.name,
            "state_since": round(time.time() - self.lifecycle.seconds_in_state(), 3),
            "state_for_s": round(self.lifecycle.seconds_in_state(), 3),
            "ready": ready,
            "ready_reason": reason,
            "in_flight": self.in_flight,
            "unsettled": self._settler.backlog,
            "processed": counters["completed"],
            "failed": counters["failed"],
            "dead_lettered": counters["dead_lettered"],
            "last_error": self.last_error,
            "counters": counters,
            "time": time.time(),
        }
