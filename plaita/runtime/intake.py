"""Turning a read batch into running tasks: parse, dead-letter the malformed, lease, dispatch.

Owned by the owner thread (the only one that adds in-flight tasks), so no scan of our own
pending list or reclaim pass can race an accept.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from plaita.config import DEFAULT_MAX_PREFETCH, READ_BATCH_MAX, Settings
from plaita.errors import BadTaskError
from plaita.runtime.counters import Counters
from plaita.runtime.inflight import InFlight, InFlightTable, lease_ref
from plaita.runtime.outcomes import Outcome
from plaita.runtime.pool import Pool
from plaita.runtime.settler import Settler
from plaita.store.leases import Lease, LeaseManager, PendingAcquire
from plaita.store.streams.entries import Entry
from plaita.tasks import Task, parse_entry

logger = logging.getLogger(__name__)

#: Handlers faster than this (mean) let the worker read ahead (automatic prefetch).
FAST_HANDLER_S = 0.005
#: With read-ahead, the smallest read while the handlers still have queued work (see ``free_slots``).
MIN_READ_AHEAD = READ_BATCH_MAX // 4
#: Below this claim threshold every task takes its lease before it starts (see ``accept``).
LAZY_LEASE_MIN_IDLE_MS = 1000


@dataclass(slots=True)
class ReadBatch:
    """A parsed read batch whose leased tasks have not started yet (``Intake.parse_batch``).

    It lives within one owner step: ``ConsumePhases.read`` starts or drops every batch before
    the step ends, so no scan of our pending list (RESUMING_OWN, a reclaim pass) can meet an
    entry that is read but neither in flight nor settling."""

    #: Tasks that start once they hold their execution's lease, with their entries.
    eager: list[tuple[Task, Entry]]
    read_at_s: float
    #: How many of the batch's tasks started at once (no lease needed yet).
    started: int
    #: The acquire of ``eager``'s leases, sent and not yet answered.
    acquire: PendingAcquire | None = None


class Intake:
    """Accepts read batches for one worker."""

    def __init__(
        self,
        settings: Settings,
        *,
        inflight: InFlightTable,
        pool: Pool,
        settler: Settler,
        leases: LeaseManager,
        counters: Counters,
        named: bool = False,
    ) -> None:
        self.settings = settings
        #: The handler runs named tasks: a body's ``type`` may be any task name (``validate_body``).
        self.named = named
        self.inflight = inflight
        self.pool = pool
        self.settler = settler
        self.leases = leases
        self.counters = counters
        #: Lazy message-id leases rely on idle time < claim_min_idle_ms until the first renewal
        #: (at most 2/3 of it); with a threshold this short, take every lease eagerly instead.
        self.eager_leases = settings.eager_leases or settings.claim_min_idle_ms < LAZY_LEASE_MIN_IDLE_MS
        self._bad_keys_seen: set[str] = set()
        #: The last read filled all it asked for: the stream has a backlog (see ``free_slots``).
        self.backlog_seen = False
        #: DLQ reasons of suspects found guilty of crashes, by message id: set on their tasks
        #: (``Task.crash_verdict``) for the handler (``plaita.runtime.suspects``).
        self.verdicts: dict[str, str] = {}

    def ours(self) -> set[str]:
        """Ids of work still running here or awaiting its ack. Take it *before* reading: an id
        is in one of the two sets until its ack lands (the outcome is queued before the task
        leaves the in-flight table), so nothing read afterwards can slip between them."""
        return self.inflight.ids() | self.settler.unsettled_ids()

    def free_slots(self, unstarted: int = 0) -> int:
        """How many entries the next read may take; ``unstarted``: tasks read and not yet in flight."""
        prefetch = self.settings.prefetch
        if prefetch is None:
            mean = self.pool.mean_duration_s
            prefetch = DEFAULT_MAX_PREFETCH if mean is not None and mean < FAST_HANDLER_S else 0
        concurrency, in_flight = self.settings.concurrency, len(self.inflight) + unstarted
        free = min(READ_BATCH_MAX, concurrency + prefetch - in_flight)
        if prefetch and self.backlog_seen and free < MIN_READ_AHEAD and in_flight >= 2 * concurrency:
            # With a backlog, reading as soon as a few slots free up fetches a handful of entries
            # per round trip (and each read costs a hand-off per handler thread): while every
            # handler still has a task queued, wait for a fair batch instead.
            return 0
        return free

    def accept(self, entries: list[Entry]) -> int:
        """Dispatch a read batch at once (``parse_batch``, ``send_acquire``, ``start_leased``).
        Returns how many of its tasks started."""
        batch = self.parse_batch(entries)
        self.send_acquire(batch)
        return self.start_leased(batch)

    def parse_batch(self, entries: list[Entry]) -> ReadBatch:
        """Parse a read batch: malformed entries go straight to the DLQ, tasks that need no lease
        yet start now, and the rest wait in the returned batch for their leases.

        A task of an execution (body ``execution_id``) starts only once it holds that
        execution's lease (one round trip for the batch), so a start and a resume of the same
        execution never run at once. A task without one is keyed by its own message id, which
        no other entry shares: it starts at once and takes its lease only if it is still running
        at the first renewal (``LeaseRenewer.renew_once``). Until then its idle time, reset by the
        read, is below ``claim_min_idle_ms``, so no reclaim can take it: the same protection,
        without a Lua call per short task.
        """
        eager: list[tuple[Task, Entry]] = []
        started: list[Task] = []
        lazy: list[InFlight] = []
        now = time.monotonic()
        running = self.inflight.present([e.message_id for e in entries])
        for entry in entries:
            task = self._parse(entry, running)
            if task is None:
                continue
            running.add(task.message_id)  # a batch never repeats an id; were it to, it runs once
            if self.eager_leases or "execution_id" in task.body:
                eager.append((task, entry))
                continue
            assert entry.fields is not None
            lazy.append(InFlight(task, entry.fields, None, now, read_at_s=now))
            started.append(task)
        self.inflight.add_many(lazy)  # one lock round for the batch; before any of them can finish
        self.pool.submit(started)
        self.counters.add("read", len(started))
        return ReadBatch(eager, now, len(started))

    def send_acquire(self, batch: ReadBatch) -> None:
        """Send the acquire of the batch's leases (one script call), not waiting for its reply."""
        if not batch.eager:
            return
        eager = batch.eager
        try:
            batch.acquire = self.leases.send_acquire_many(_execution_ids(eager), [t.keyspace for t, _ in eager])
        except Exception:
            self.inflight.suspect_orphans(lease_ref(t) for t, _ in eager)  # part of it may have run
            raise

    def start_leased(self, batch: ReadBatch) -> int:
        """Read the acquire's reply and start the tasks that got their lease. Returns how many of
        the batch's tasks started, those ``parse_batch`` started included."""
        if not batch.eager:
            return batch.started
        acquire, batch.acquire = batch.acquire, None
        assert acquire is not None, "send_acquire first"
        started: list[Task] = []
        try:
            leases = acquire.result()
        except Exception:
            # Redis may have set some of these leases anyway: released as orphans after the
            # outage; the entries stay in our pending list and are re-read then.
            self.inflight.suspect_orphans(lease_ref(t) for t, _ in batch.eager)
            raise
        try:
            self._take_leases(batch.eager, batch.read_at_s, started, leases, retry_own=True)
        finally:
            self.pool.submit(started)
        self.counters.add("read", len(started))
        return batch.started + len(started)

    def drop(self, batch: ReadBatch) -> None:
        """Give up a batch whose leased tasks will not start here now (the caller failed between
        ``send_acquire`` and ``start_leased``): its entries stay in our pending list, re-read after
        the outage; leases its acquire may have set are released as orphans first."""
        acquire, batch.acquire = batch.acquire, None
        if acquire is not None:
            acquire.abandon()
            self.inflight.suspect_orphans(lease_ref(t) for t, _ in batch.eager)

    def _lease(
        self, eager: list[tuple[Task, Entry]], now: float, started: list[Task], *, retry_own: bool = True
    ) -> None:
        """Acquire the leases of ``eager`` in one round trip and take them (``_take_leases``)."""
        try:
            leases = self.leases.acquire_many(_execution_ids(eager), [t.keyspace for t, _ in eager])
        except Exception:
            # Redis may have set some of these leases anyway: released as orphans after the
            # outage; the entries stay in our pending list and are re-read then.
            self.inflight.suspect_orphans(lease_ref(t) for t, _ in eager)
            raise
        self._take_leases(eager, now, started, leases, retry_own=retry_own)

    def _take_leases(
        self,
        eager: list[tuple[Task, Entry]],
        now: float,
        started: list[Task],
        leases: list[Lease | str],
        *,
        retry_own: bool,
    ) -> None:
        """Put the tasks that got their lease in flight and append them to ``started`` as they do
        (so a failure later in the batch cannot strand them)."""
        orphaned: list[tuple[Task, Entry]] = []
        leased: list[InFlight] = []
        try:
            for (task, entry), got in zip(eager, leases, strict=True):
                if isinstance(got, str):
                    if retry_own and self._orphaned(task, got, leased):
                        orphaned.append((task, entry))  # our own lease, yet nothing of it runs here
                    else:
                        self._refused(task, got)
                    continue
                task.fencing_token = got.generation
                assert entry.fields is not None
                leased.append(InFlight(task, entry.fields, got, now, read_at_s=now))
                started.append(task)
        finally:
            self.inflight.add_many(leased)  # one lock round for the batch, before any can start
        if orphaned:
            self._release_and_retry(orphaned, now, started)

    def _orphaned(self, task: Task, holder: str, leased: list[InFlight]) -> bool:
        """The refusal names our own lease, yet no task of that execution runs here (nor was
        leased earlier in this batch): left by an acquire whose reply was lost."""
        if self.leases.ours(task.execution_id, holder, task.keyspace) is None:
            return False
        ref = lease_ref(task)
        return not self.inflight.runs_execution(ref) and all(lease_ref(i.task) != ref for i in leased)

    def _release_and_retry(self, orphaned: list[tuple[Task, Entry]], now: float, started: list[Task]) -> None:
        """Leases of ours that nothing here runs were left by an acquire whose reply was lost (on a
        cluster, a pipeline can fail on one master after another ran its part): release them now
        (owner thread: nothing can start meanwhile) and acquire once more, instead of leaving
        their entries pending until the TTL."""
        refs = {lease_ref(t): t for t, _ in orphaned}
        try:
            for task in refs.values():
                if self.leases.release_orphan(task.execution_id, task.keyspace):
                    logger.info(
                        "released an orphan lease of execution %s (its acquire reply was lost)", task.execution_id
                    )
        except Exception:
            self.inflight.suspect_orphans(refs)  # released after the outage; the entries stay pending
            raise
        self._lease(orphaned, now, started, retry_own=False)

    def _refused(self, task: Task, holder: str) -> None:
        """The lease was refused: another holder has it, or its key is not a lease at all."""
        if not holder.startswith("!"):
            self.counters.add("lease_conflicts", 1)
            logger.info(
                "execution %s is leased by %s; task %s left pending until that lease ends",
                task.execution_id,
                holder,
                task.message_id,
            )
            return
        self.counters.add("bad_keys", 1)
        if task.execution_id not in self._bad_keys_seen:  # once per execution, not every pass
            self._bad_keys_seen.add(task.execution_id)
            logger.error(
                "the lease key of execution %s is not a plaita lease (%s): task %s stays pending and every "
                "other task goes on; delete or fix %s to let it run",
                task.execution_id,
                holder[1:],
                task.message_id,
                (task.keyspace or self.leases.keyspace).lease_key(task.execution_id),
            )

    def parse(self, entry: Entry) -> Task:
        """The task of a stream entry read whole; BadTaskError with the reason when it is none."""
        assert entry.fields is not None
        return parse_entry(
            entry.message_id,
            entry.fields,
            entry.delivery_count,
            max_payload_bytes=self.settings.max_payload_bytes,
            problems=entry.problems,
            named=self.named,
        )

    def _parse(self, entry: Entry, running: set[str]) -> Task | None:
        """The entry as a runnable task, or None (dead-lettered, deleted, or already running).
        ``running``: the batch's ids that were in flight when it was accepted."""
        if entry.fields is None:
            self.settler.put(Outcome(entry.message_id))  # deleted from the stream: clear the PEL
            return None
        if entry.message_id in running:
            return None  # already running here (our own idle entry came back)
        try:
            task = self.parse(entry)
        except BadTaskError as exc:
            self._malformed(entry, exc.reason)
            return None
        except Exception as exc:  # whatever one entry does to the parser, it is that entry's problem
            self._malformed(entry, f"unparseable entry ({type(exc).__name__}: {str(exc)[:200]})")
            return None
        if task.delivery_count > self.settings.max_deliveries:
            logger.error(
                "task %s was delivered %d times without success: moved to the DLQ", task.message_id, task.delivery_count
            )
            self.dead_letter(entry, "max_deliveries", task.body)
            return None
        ks = self.leases.keyspace
        if ks.partitions > 1:  # only then can an entry sit on the wrong partition
            home = ks.home_of_misrouted(entry.message_id, task.body.get("execution_id"))
            if home is not None:  # its lease and state live in another partition's slot
                self._misrouted(entry, task, home)
                return None
        # Validated by parse_entry: a tenant's task takes its lease in the tenant's namespace.
        tenant = task.tenant_id
        task.keyspace = ks.for_tenant(tenant) if tenant else ks
        if self.verdicts:
            task.crash_verdict = self.verdicts.get(task.message_id)
        return task

    def _misrouted(self, entry: Entry, task: Task, home: int) -> None:
        """A task on the wrong partition: to the DLQ with its body, so ``plaita dlq requeue``
        (which routes by the body) puts it where it belongs."""
        n = self.leases.keyspace.partitions
        reason = (
            f"misrouted: execution {task.execution_id!r} belongs to partition {home} (crc32 % {n}); enqueue "
            "with `plaita enqueue --partitions N` or plaita.store.partitioned.open_queue, or `plaita dlq requeue` it"
        )
        self.counters.add("bad_input", 1)
        logger.warning("task %s is misrouted (%s): moved to the DLQ", entry.message_id, reason)
        self.dead_letter(entry, reason, task.body)

    def _malformed(self, entry: Entry, reason: str) -> None:
        self.counters.add("bad_input", 1)
        logger.warning("task %s is malformed (%s): moved to the DLQ", entry.message_id, reason)
        self.dead_letter(entry, reason, None)

    def dead_letter(self, entry: Entry, reason: str, body: Any) -> None:
        """Move ``entry`` to the DLQ with ``reason`` (through the settler), counted."""
        self.counters.add("dead_lettered", 1)
        self.settler.put(Outcome.to_dlq(entry.message_id, reason, entry.delivery_count, body, entry.fields))


def _execution_ids(eager: list[tuple[Task, Entry]]) -> list[str]:
    """``task.execution_id`` of every task, without a property call per task: ``parse_entry``
    lets through only a body whose ``execution_id`` is absent or a non-empty string."""
    return [t.body.get("execution_id") or t.message_id for t, _ in eager]
