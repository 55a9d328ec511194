"""ISOLATING: the tasks a dead worker process had in flight run one at a time, nothing beside them.

A step that calls ``os._exit``, is killed by a signal (the OOM killer's SIGKILL) or segfaults takes
its whole worker process with it, and every task that ran beside it. The successor cannot tell
which one did it, so it treats all of them as *suspects*:

- its own pending entries found by the first scan after the process started (RESUMING_OWN),
  unless its predecessor under the same consumer name recorded a graceful stop with no suspect
  left (then they are tasks handed back or failed and awaiting redelivery: no crash's);
- entries a reclaim pass took from another consumer that had not talked to Redis for at least half
  of ``--claim-min-idle-ms`` and two reads' BLOCK + 1 s (``silent_ms``: a dead worker's; a live
  one's failed tasks are plain redeliveries).

A suspect is never charged a delivery: the re-read that found it bumped its count, and the count
is set back (``StreamQueue.recount_own``). In ISOLATING the worker reads nothing, lets what else
runs finish, then runs the suspects one by one: before each, ``CrashStrikes.turn`` counts the
crash it was in flight for and arms its record with its message id (a *lone* suspect, the only
entry the start scan found pending, is the only candidate: that crash is blamed on it at once);
when it has ended (settled, whatever its outcome) the record is deleted. A successor that finds
the record still armed for that entry knows the process died while it ran alone: the crash is blamed on it. Once it has
``--max-crashes`` crashes with this last one blamed, it is dead-lettered with the reason instead
of run: a flow runner (a handler with ``crash_verdicts``) ends its execution ``error`` with that
reason first (the ``execution_error`` alert), so the keeper never re-enqueues it.

Every Redis call here raises to the owner loop (``redis_failed`` -> BACKOFF); suspects not run yet
stay in memory (and in our pending list), and ISOLATING comes back after the outage.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time

from plaita.config import Settings
from plaita.fsm import Lifecycle
from plaita.runtime.intake import Intake
from plaita.store.executions.crashes import CrashStrikes
from plaita.store.streams.entries import Entry
from plaita.store.streams.queue import StreamQueue
from plaita.tasks import Task

logger = logging.getLogger(__name__)

#: A claimed entry is a suspect when the consumer it came from had been silent this share of
#: ``--claim-min-idle-ms`` (``silent_ms``): a live worker talks to Redis every renewal (a third of it).
DEAD_OWNER_SHARE = 0.5
#: ... and at least this long beyond two reads' BLOCK: a live worker reads at least that often.
DEAD_OWNER_MIN_MS = 1000


def silent_ms(settings: Settings) -> float:
    """How long a consumer must have been silent for its claimed tasks to be a dead worker's."""
    return max(settings.claim_min_idle_ms * DEAD_OWNER_SHARE, 2 * settings.read_block_ms + DEAD_OWNER_MIN_MS)


#: Longest wait of one ISOLATING step for the running suspect (a stop or a finish cuts it short).
POLL_S = 0.05
#: The same while its ack is being sent (acks go out within a few ms).
ACK_POLL_S = 0.002
#: Longest wait for the clean-stop record while stopping (a frozen Redis must not delay the exit).
CLEAN_STOP_TIMEOUT_S = 0.3


def verdict_reason(crashes: int) -> str:
    """The DLQ reason and the execution's error message for a task that killed its process."""
    return (
        f"killed its worker process {crashes} times (exit code or signal unknown: the worker that found the task "
        "is its successor; the supervisor's log has them)"
    )


class Suspects:
    """The suspects of one worker process and the ISOLATING step (owner thread only)."""

    def __init__(
        self,
        settings: Settings,
        *,
        queue: StreamQueue,
        lifecycle: Lifecycle,
        intake: Intake,
        strikes: CrashStrikes,
        judges: bool,
        slot_freed: threading.Event,
    ) -> None:
        self.settings = settings
        self.queue = queue
        self.lifecycle = lifecycle
        self.intake = intake
        self.strikes = strikes
        #: The handler ends a task's execution itself when given a ``crash_verdict`` (flows).
        self.judges = judges
        self.slot_freed = slot_freed
        self._waiting: dict[str, Entry] = {}  # suspects not run yet, in the order found
        self._counts: dict[str, int] = {}  # each suspect's delivery count before its crash re-read
        self._armed: set[str] = set()  # suspects this process armed (a re-turn is not a crash)
        self._current: tuple[str, str | None] | None = None  # (message id, strike key) running alone
        self._start_scan = True  # until the first scan of our own entries is through
        self._clean_start: bool | None = None
        self._own_seen = 0  # entries the start scan found pending, deleted ones included
        self._lone: str | None = None  # the start scan's only entry: the crash is blamed on it at once
        self._stop_key = strikes.clean_stop_key(queue.keyspace, settings.consumer_name)
        self._renew_at_s = 0.0

    # -- finding suspects ------------------------------------------------------------------
    @property
    def pending(self) -> bool:
        """Suspects wait or one runs: ISOLATING has work."""
        return bool(self._waiting) or self._current is not None

    def from_own_scan(self, entries: list[Entry]) -> list[Entry]:
        """A page of our own pending entries: keep the suspects, return what runs as usual."""
        known = [e for e in entries if e.message_id in self._counts]
        if known:  # re-read after an outage: that read is no delivery either
            self.queue.recount_own({e.message_id: self._counts[e.message_id] for e in known})
        entries = [e for e in entries if e.message_id not in self._counts]
        if not self._start_scan:
            return entries
        if self._clean_start is None:  # taken at the first page, empty or not: it is for this start only
            self._clean_start = self.strikes.take_clean_stop(self._stop_key)
        if self._clean_start or not entries:
            return entries
        self._own_seen += len(entries)
        return self._take(entries)

    def own_scan_done(self) -> None:
        """The first scan of our own entries is through: later scans find no crash's tasks."""
        if self._start_scan and self._clean_start is None:  # nothing was pending: the mark is stale now
            self._clean_start = self.strikes.take_clean_stop(self._stop_key)
        if self._start_scan and self._own_seen == 1 and len(self._waiting) == 1:
            # Our predecessor had this one entry pending when it died: nothing else can have done it.
            self._lone = next(iter(self._waiting))
        self._start_scan = False

    def from_claim(self, entries: list[Entry]) -> list[Entry]:
        """Entries a reclaim pass took: keep those of a silent (dead) consumer, return the rest."""
        silent = silent_ms(self.settings)
        dead = [e for e in entries if e.owner_idle_ms is not None and e.owner_idle_ms >= silent]
        if not dead:
            return entries
        dead_ids = {e.message_id for e in dead}
        return [e for e in entries if e.message_id not in dead_ids] + self._take(dead)

    def _take(self, entries: list[Entry]) -> list[Entry]:
        """Keep ``entries`` as suspects, the crash re-read's delivery taken back; return those that
        are no suspects (deleted from the stream: the intake clears them)."""
        live = [e for e in entries if e.fields is not None]
        counts = {e.message_id: max(1, e.delivery_count - 1) for e in live}
        kept = set(self.queue.recount_own(counts)) if counts else set()
        taken = [dataclasses.replace(e, delivery_count=counts[e.message_id]) for e in live if e.message_id in kept]
        for e in self._blamed_last(taken):
            self._counts[e.message_id] = e.delivery_count
            self._waiting[e.message_id] = e
        if kept:
            logger.warning(
                "%d task(s) were in flight when a worker process died: running them one at a time (%s)",
                len(kept),
                ", ".join(sorted(kept)[:10]),
            )
        return [e for e in entries if e.fields is None]

    def _blamed_last(self, entries: list[Entry]) -> list[Entry]:
        """``entries`` with those that were running alone when the process died (most likely the
        killer) moved to the end: the others run, and are cleared, before it can crash again."""
        keyed = [(e, self._key(self._parse(e))) for e in entries]
        with_keys = [(e, k) for e, k in keyed if k is not None]
        armed = self.strikes.armed_for([k for _, k in with_keys], [e.message_id for e, _ in with_keys])
        last = {e.message_id for (e, _), a in zip(with_keys, armed, strict=True) if a}
        return [e for e in entries if e.message_id not in last] + [e for e in entries if e.message_id in last]

    def _key(self, task: Task | None) -> str | None:
        return None if task is None else self.strikes.key(task.keyspace, task.execution_id)

    # -- ISOLATING -----------------------------------------------------------------------------
    def step(self) -> None:
        """One step: wait for the running suspect or other work, else run the next suspect alone;
        ``suspects_cleared`` once none is left."""
        if self._current is not None and not self._finish_current():
            # Its ack is on its way once it left the in-flight table: look again soon.
            self._wait(ACK_POLL_S if self._current[0] not in self.intake.inflight else POLL_S)
            return
        if len(self.intake.inflight):  # work read before the suspects were found ends first
            self._wait(POLL_S)
            return
        if not self._waiting:
            self.lifecycle.trigger("suspects_cleared")
            return
        self._run_alone(next(iter(self._waiting.values())))

    def _finish_current(self) -> bool:
        """True once the running suspect has settled (its record deleted: the process lived)."""
        assert self._current is not None
        mid, key = self._current
        if mid in self.intake.ours():
            return False
        if key is not None:
            self.strikes.clear(key)
        self._current = None
        self._forget(mid)
        return True

    def _forget(self, mid: str) -> None:
        self._waiting.pop(mid, None)
        self._counts.pop(mid, None)
        self._armed.discard(mid)

    def _wait(self, timeout_s: float) -> None:
        now = time.monotonic()
        if self._waiting and now >= self._renew_at_s:
            # Waiting suspects are ours: keep them from looking abandoned to other workers.
            self.queue.renew_pending(list(self._waiting))
            self._renew_at_s = now + min(self.settings.claim_min_idle_ms / 1000, self.settings.lease_ttl_s) / 3
        self.slot_freed.wait(timeout_s)
        self.slot_freed.clear()

    def _run_alone(self, entry: Entry) -> None:
        mid = entry.message_id
        if not self.queue.recount_own({mid: entry.delivery_count}):  # claimed by another worker meanwhile
            logger.info("suspect %s was taken over by another worker", mid)
            self._forget(mid)
            return
        task = self._parse(entry)
        key = self._key(task)
        verdict = self._turn(mid, key) if key is not None else None
        if verdict is not None and not self.judges:
            assert task is not None
            self.intake.dead_letter(entry, verdict, task.body)
        else:
            self._dispatch(entry, verdict)
        del self._waiting[mid]
        if mid in self.intake.ours():
            self._current = (mid, key)
            return
        # Its lease was refused (another worker runs that execution): it did not run here.
        if key is not None and verdict is None:
            self.strikes.disarm(key, mid)
        self._forget(mid)

    def _dispatch(self, entry: Entry, verdict: str | None) -> None:
        if verdict is not None:
            self.intake.verdicts[entry.message_id] = verdict
        try:
            self.intake.accept([entry])
        finally:
            self.intake.verdicts.pop(entry.message_id, None)

    def _turn(self, mid: str, key: str) -> str | None:
        """Count the crash and arm the record; the DLQ reason once the task is found guilty."""
        if mid in self._armed:
            return None  # armed by this process already: a run cut by an outage, no crash
        lone = mid == self._lone
        turn = self.strikes.turn(key, mid, self.settings.max_crashes, lone=lone)
        if turn is None:
            return None
        self._armed.add(mid)
        why = "it was the only task in flight" if lone else "it ran alone"
        blamed = f", the last one while {why}" if turn.blamed else ""
        logger.warning("running suspect %s alone (%d crash(es) counted%s)", mid, turn.count, blamed)
        if not turn.blamed or turn.count < self.settings.max_crashes:
            return None
        reason = verdict_reason(turn.count)
        logger.error("task %s %s: moved to the DLQ", mid, reason)
        return reason

    def _parse(self, entry: Entry) -> Task | None:
        """The suspect's task with its keyspace (its strike key's home), or None when the entry is
        no task (the intake dead-letters it; no handler runs)."""
        try:
            task = self.intake.parse(entry)
            ks = self.queue.keyspace
            task.keyspace = ks.for_tenant(task.tenant_id) if task.tenant_id else ks
        except Exception:
            return None
        return task

    # -- stopping --------------------------------------------------------------------------------
    def stopped(self) -> None:
        """A graceful stop: record it for the successor, unless suspects are left (they stay
        suspects). Best effort, bounded; never raises."""
        if self.pending:
            return
        try:
            self.strikes.mark_clean_stop(self._stop_key, timeout_s=CLEAN_STOP_TIMEOUT_S)
        except Exception as exc:
            logger.warning(
                "could not record the graceful stop (%s: %s); the next worker named %s runs our pending "
                "tasks one at a time",
                type(exc).__name__,
                exc,
                self.settings.consumer_name,
            )
