"""The producer API (what a web app calls): start, resume, cancel, get, wait.

Every call is a task on the stream or a read of the state, except a cancel, which also sets the
execution's (and its descendants') cancel flag for the worker to honour: the worker holding the
execution's lease is the only writer of an execution's document, so a producer never races a step.
``FlowClient.from_url(url)`` builds its own queue and store (close it, or use ``with``);
``FlowClient(queue)`` uses a queue the caller built and owns.
"""

from __future__ import annotations

import builtins
import getpass
import logging
import math
import socket
import time
import uuid
from collections.abc import Sequence
from typing import Any, Unpack

from plaita.clock import wall_s
from plaita.config import DEFAULT_REDIS_URL
from plaita.errors import PlaitaError
from plaita.flows import retention
from plaita.flows.fork import NotForkable as NotForkable
from plaita.flows.fork import start_fork
from plaita.flows.model import bodies as model
from plaita.flows.model.execution import Execution
from plaita.flows.model.validate import check_deadline_s, check_wait_name, require_json
from plaita.flows.producer.cancel import CancelOutcome, request_cancel
from plaita.flows.producer.listing import ExecutionPage, ListFilters, StepRow, list_executions, steps_of, stores_of
from plaita.flows.retention import Deleted
from plaita.flows.retention import NotDeletable as NotDeletable
from plaita.flows.tracing import producing
from plaita.store.executions.store import QUEUED, TERMINAL, ExecutionStore
from plaita.store.keyspace import check_priority
from plaita.store.queue_access import QueueClient, QueueOptions, open_producer_queue
from plaita.store.streams.delayed import delayed_member, due_ms_of, new_member_id
from plaita.store.streams.queue import StreamQueue

logger = logging.getLogger(__name__)

#: Polling interval of ``wait`` (bounded: the wait has a timeout).
WAIT_POLL_S = 0.05


class ExecutionNotFound(PlaitaError):
    """No execution with that id (never started, or expired after its retention)."""


#: Random ids drawn to find one in a given partition (1 in N hits; 64 N tries never all miss in practice).
MAX_ID_TRIES = 100_000


class NotResumable(PlaitaError):
    """An addressed ``resume`` (``wait_for``) of an execution that has ended."""


class NotRetryable(PlaitaError):
    """``retry`` of an execution that is not ``error`` or ``cancelled`` (``completed`` needs
    ``force``), or from a step it never reached."""


def _operator() -> str:
    """Who asks, for the history's restart entry: ``user@host``."""
    try:
        user = getpass.getuser()
    except Exception:  # no login name (a container without a passwd entry)
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


class DuplicateStart(PlaitaError):
    """``start(..., on_duplicate="raise")`` whose dedup key is held: ``execution_id`` holds it."""

    def __init__(self, execution_id: str, dedup_key: str | None) -> None:
        super().__init__(f"dedup key {dedup_key!r} is held by execution {execution_id!r}; nothing enqueued")
        self.execution_id = execution_id
        self.dedup_key = dedup_key


#: What ``start`` does when its dedup key is held: return the holder's id, or raise DuplicateStart.
ON_DUPLICATE = ("return", "raise")


class WaitTimeout(PlaitaError):
    """``wait`` reached its timeout before the execution ended (in a step: retried, it may end
    by the next attempt)."""

    retryable = True


class FlowClient(QueueClient):
    """Producer side of executions over one stream."""

    def __init__(
        self, queue: StreamQueue, store: ExecutionStore | None = None, *, tenant_id: str | None = None
    ) -> None:
        """``tenant_id``: every call is about that tenant's executions (None: the default tenant's);
        ValueError for an invalid one (``plaita.tasks.TENANT_ID``)."""
        super().__init__(queue)
        store = store if store is not None else ExecutionStore.sharing(queue)
        self.store = store.for_tenant(tenant_id)
        #: The tenant of this client's executions ("" = the default tenant).
        self.tenant_id = self.store.ks.tenant

    def for_tenant(self, tenant_id: str | None) -> FlowClient:
        """A client of ``tenant_id``'s executions on the same queue and connections (closing it
        leaves them open: this client owns them)."""
        return FlowClient(self.queue, self.store, tenant_id=tenant_id)

    @classmethod
    def from_url(
        cls, url: str = DEFAULT_REDIS_URL, *, tenant_id: str | None = None, **options: Unpack[QueueOptions]
    ) -> FlowClient:
        """A client over the queue at ``url`` (``redis://``, ``rediss://``, ``redis+sentinel://``,
        ``redis+cluster://``); ``options`` (``queue_name`` and ``partitions``, which must be the
        workers', ``tls_ca_file``, ``tls_cert_file``, ``tls_key_file``, ``socket_timeout_s``) and
        their defaults: ``plaita.store.queue_access.open_producer_queue``; ``tenant_id`` as in the
        constructor (``for_tenant`` gives the other tenants' clients on the same connections).
        Connects lazily (never raises for Redis down); ConfigError for a bad URL or an unreadable
        TLS file."""
        return cls(open_producer_queue(url, **options), tenant_id=tenant_id).owning()

    def start(
        self,
        flow_id: str,
        params: dict[str, Any] | None = None,
        *,
        execution_id: str | None = None,
        dedup_key: str | None = None,
        version: str | None = None,
        deadline_s: float | None = None,
        on_duplicate: str = "return",
        delay_s: float | None = None,
        at: float | None = None,
        priority: int = 0,
    ) -> str:
        """Record the execution as ``queued`` and enqueue its start, in one atomic call; returns
        its id. With ``dedup_key`` already held (by a start within 7 days, however close), nothing
        is enqueued and the holder's id is returned; ``on_duplicate="raise"`` raises
        ``DuplicateStart`` (its ``execution_id`` the holder's) instead. An ``execution_id`` that
        exists already is enqueued as before (a no-op for a worker unless it is still running).

        ``deadline_s``: the whole execution must end within that many seconds from now (this
        machine's clock); past it the execution is cancelled, its children too, and its
        ``error`` says ``DeadlineExceeded``. ValueError unless finite, above 0, at most 10 years.

        ``delay_s`` (seconds from now) or ``at`` (epoch seconds): a delayed start. It is recorded
        ``queued`` at once (``waiting`` says until when), so get, list and cancel see it; its
        task is added to the queue when due (``plaita.store.streams.delayed``). A deadline counts
        from now, not from the due time. ValueError for both, or one not within 10 years.

        ``priority`` 0..9 (default 0): the start goes to its partition's stream of that level;
        workers read higher levels first without starving the lower (docs/flows.md). It orders
        the start; the execution's later tasks (resumes, retries) go at level 0. ValueError
        unless an int within 0..9."""
        check_priority(priority)
        if params is not None and not isinstance(params, dict):
            raise TypeError("params must be a dict (a JSON object)")
        if on_duplicate not in ON_DUPLICATE:
            raise ValueError(f"on_duplicate must be one of {', '.join(ON_DUPLICATE)}, not {on_duplicate!r}")
        require_json(params, "params")  # NaN/Infinity would be dead-lettered by the worker
        now_s = wall_s()  # the test clock's, under plaita.testing
        deadline_at = None if deadline_s is None else now_s + check_deadline_s(deadline_s)
        due_ms = due_ms_of(delay_s, at, now_s)
        if dedup_key is not None and execution_id is not None:
            self._check_same_partition(execution_id, dedup_key)
        eid = execution_id or self._new_id(dedup_key)
        body = model.start_body(
            flow_id,
            params or {},
            eid,
            dedup_key=dedup_key,
            version=version,
            deadline_at=deadline_at,
            tenant_id=self.tenant_id,
        )
        task_id = new_member_id() if due_ms else ""
        record = Execution.queued(
            eid,
            flow_id,
            params or {},
            dedup_key=dedup_key,
            version=version,
            now_s=now_s,
            deadline_at=deadline_at,
            due=(due_ms, task_id) if due_ms else None,
        )
        ks = self.queue.keyspace
        with producing([body], ks.queue):
            stream = self.queue.partition_queues()[ks.partition_of(eid)].stream_for(priority)
            # Built in here: the body carries its trace context from now on.
            delayed = delayed_member(body, due_ms, member_id=task_id) if due_ms else None
            done = self.store.enqueue_start(
                eid, body, record.encode(), stream=stream, now_s=now_s, dedup_key=dedup_key, delayed=delayed
            )
        if done.duplicate and on_duplicate == "raise":
            raise DuplicateStart(done.execution_id, dedup_key)
        return done.execution_id

    def _check_same_partition(self, execution_id: str, dedup_key: str) -> None:
        """ValueError unless the execution id and its dedup key fall in one partition: the
        dedup key is only ever looked up in its own."""
        ks = self.queue.keyspace
        if ks.partition_of(execution_id) != ks.partition_of(dedup_key):
            raise ValueError(
                f"with {ks.partitions} partitions a dedup key is seen only in its own partition: execution id "
                f"{execution_id!r} is in partition {ks.partition_of(execution_id)}, dedup key {dedup_key!r} in "
                f"{ks.partition_of(dedup_key)}; leave execution_id out and one is chosen there"
            )

    def resume(
        self,
        execution_id: str,
        resume_type: str = "event",
        data: Any = None,
        *,
        resume_id: str | None = None,
        wait_for: str | None = None,
    ) -> str:
        """Enqueue a resume (``resume_type`` event, continue, retry, timeout or cancel); returns its task id.

        Pass ``resume_id`` to make a repeated call (say, a webhook delivered twice) a no-op.
        ``wait_for`` addresses an event to the wait of that name (``ctx.suspend(wait_for=...)``):
        only it takes the event, and an event that comes before its wait is kept until the wait
        runs (``plaita.flows.model.inbox``). NotResumable when the execution has ended (no wait can
        take it any more); ValueError for a bad name or type.
        ExecutionNotFound when there is no execution, or it is still ``queued`` (no worker ran
        its start yet) and the resume is not addressed: nothing waits to take it. An addressed one
        (``wait_for``, a message) to a queued execution is kept: the worker hands it back until
        the start has run, then it waits in the inbox like any early event.
        """
        if resume_type not in model.RESUME_TYPES:
            raise ValueError(f"resume_type must be one of {', '.join(sorted(model.RESUME_TYPES))}")
        check_wait_name(wait_for)
        if wait_for is not None and resume_type != "event":
            raise ValueError(f"wait_for addresses an event; a {resume_type!r} resume takes none")
        require_json(data, "data")
        doc = self._require(execution_id)
        if wait_for is not None and doc.get("status") in TERMINAL:
            raise NotResumable(f"execution {execution_id} is {doc.get('status')}: no wait can take a resume any more")
        if doc.get("status") == QUEUED and wait_for is None:  # nothing runs yet that could take it
            raise ExecutionNotFound(f"execution {execution_id!r} is queued: its start has not run, nothing to resume")
        flow_id, tenant = doc.get("flow_id"), self.tenant_id
        body = model.resume_body(
            execution_id,
            resume_type,
            flow_id=flow_id,
            data=data,
            resume_id=resume_id,
            tenant_id=tenant,
            wait_for=wait_for,
        )
        return self._enqueue(body)

    def send(self, execution_id: str, topic: str, data: Any = None, idempotency_key: str | None = None) -> str:
        """Send a message to ``topic`` of a running or suspended execution; returns its task id.

        A step takes it with ``ctx.recv(topic)``. A message is an event addressed to the wait
        ``topic`` (``resume(id, "event", data, wait_for=topic)``: the same door): messages that
        come before their recv are kept in the execution, oldest first, and each recv takes the
        oldest (at most 32 kept per execution, 7 days each). ``idempotency_key``: a repeated send
        with it is a no-op (remembered with the execution, its last 100 resume ids). NotResumable
        when the execution has ended; ExecutionNotFound when there is none (or it is still
        ``queued``: its start has not run yet); ValueError for a bad topic or data."""
        if idempotency_key is not None and (not isinstance(idempotency_key, str) or not idempotency_key):
            raise ValueError(f"idempotency_key must be a non-empty string, not {idempotency_key!r}")
        if check_wait_name(topic, "topic") is None:
            raise ValueError("a message needs a topic")
        resume_id = None if idempotency_key is None else f"msg:{topic}:{idempotency_key}"
        return self.resume(execution_id, "event", data, resume_id=resume_id, wait_for=topic)

    def retry(
        self,
        execution_id: str,
        from_step: str | None = None,
        *,
        force: bool = False,
        by: str | None = None,
        resume_id: str | None = None,
    ) -> str:
        """Restart an ``error`` or ``cancelled`` execution at the step it ended at (or
        ``from_step``, one it has run), keeping the results of the steps before it. A task the
        worker holding the execution's lease runs (fenced, like every write); returns its resume
        id (pass ``resume_id`` to make a repeated call a no-op). A ``completed`` one is re-run
        only with ``force``: without, nothing is enqueued and "" is returned (it is done, a no-op).
        NotRetryable when refused (running, suspended, queued; a step it never ran); ExecutionNotFound."""
        doc = self._require(execution_id)
        status = doc.get("status")
        if status not in TERMINAL:
            raise NotRetryable(f"execution {execution_id} is {status}: only an error or cancelled one can be retried")
        if status == "completed" and not force:  # done already: nothing to retry (a no-op, not an error)
            logger.info("retry of execution %s: it completed, nothing enqueued (force re-runs it)", execution_id)
            return ""
        if from_step is not None:
            reached = {e.get("step") for e in doc.get("history") or [] if isinstance(e, dict)}
            reached |= set(doc.get("results") or {}) | {doc.get("step")}
            if from_step not in reached:
                raise NotRetryable(f"execution {execution_id} never ran a step {from_step!r}")
        rid = resume_id or f"retry:{uuid.uuid4().hex}"
        who = by or _operator()
        body = model.restart_body(
            execution_id,
            flow_id=doc.get("flow_id"),
            from_step=from_step,
            force=force,
            by=who,
            resume_id=rid,
            tenant_id=self.tenant_id,
        )
        self._enqueue(body)
        return rid

    def fork(self, execution_id: str, from_step: str, new_id: str | None = None, *, by: str | None = None) -> str:
        """Start a new execution (``new_id``, or a fresh id) of the same flow and params at
        ``from_step``, with the results of the steps before it and the state copied; the original
        is left as it is (any status but ``queued``). Returns the new id. NotForkable when the
        original never ran ``from_step`` or ``new_id`` is taken; ExecutionNotFound
        (``plaita.flows.fork``)."""
        original = self._require(execution_id)
        eid = _checked_id(new_id) if new_id is not None else self._new_id(None)
        return start_fork(self.store, self.queue.keyspace, original, from_step, eid, by=by or _operator())

    def delete(self, *execution_ids: str, force: bool = False, timeout_s: float = 60.0) -> list[Deleted]:
        """Delete ended executions and every key they own (``plaita.flows.retention``); one not
        ended raises NotDeletable (nothing deleted) unless ``force``: cancelled first, deleted once
        ended (NotDeletable if not within ``timeout_s``)."""
        return retention.delete(self, [_checked_id(e) for e in execution_ids], force=force, timeout_s=timeout_s)

    def prune(
        self,
        ended_before_s: float,
        *,
        statuses: Sequence[str] = retention.ENDED,
        dry_run: bool = False,
        limit: int | None = None,
    ) -> retention.Pruned:
        """Delete this tenant's executions that ended before ``ended_before_s`` (epoch seconds), in
        bounded batches (``plaita.flows.retention.prune``)."""
        return retention.prune(self.store, ended_before_s, statuses=statuses, dry_run=dry_run, limit=limit)

    def cancel_many(
        self,
        statuses: Sequence[str] = retention.NOT_ENDED,
        flow_id: str | None = None,
        *,
        dry_run: bool = False,
        limit: int = retention.CANCEL_MANY_LIMIT,
    ) -> list[str]:
        """Cancel every execution of ``statuses`` (not ended ones; of ``flow_id`` only, when
        given), at most ``limit``, newest first; returns their ids (``dry_run``: those it would
        cancel, nothing done). One that ended or went meanwhile is left out."""
        retention.check_statuses(statuses, retention.NOT_ENDED, "executions not ended can be cancelled")
        ids = [str(d.get("execution_id")) for d in retention.select(self.store, statuses, flow_id, limit)]
        if dry_run:
            return ids
        done: list[str] = []
        for eid in ids:
            try:
                if self.cancel(eid).landed:
                    done.append(eid)
            except ExecutionNotFound:  # deleted or expired since it was listed
                continue
        return done

    def resume_many(
        self,
        flow_id: str | None = None,
        *,
        wait_for: str | None = None,
        data: Any = None,
        statuses: Sequence[str] = retention.RESUMABLE,
        dry_run: bool = False,
        limit: int = retention.CANCEL_MANY_LIMIT,
    ) -> list[str]:
        """Resume (an ``event`` with ``data``) every suspended execution waiting for a resume (of
        ``flow_id`` only, in a wait named ``wait_for`` only, when given: the event is addressed
        to it), at most ``limit``, newest first, as ``resume`` does; returns their ids (``dry_run``:
        those it would resume). Each resume id names the suspension it ends, so a second run
        before the workers took the first never resumes a later wait. Sleeps and joins are not
        selected; one that ended or went meanwhile is left out."""
        retention.check_statuses(statuses, retention.RESUMABLE, "suspended executions can be resumed")
        check_wait_name(wait_for)
        require_json(data, "data")
        found = retention.select(
            self.store, statuses, flow_id, limit, lambda d: retention.waits_for_resume(d, wait_for)
        )
        if dry_run:
            return [str(d.get("execution_id")) for d in found]
        done: list[str] = []
        for doc in found:
            eid, since = str(doc.get("execution_id")), (doc.get("suspension") or {}).get("since")
            try:
                self.resume(eid, "event", data, resume_id=f"bulk:{since}:{eid}", wait_for=wait_for)
            except (ExecutionNotFound, NotResumable):  # deleted, expired or ended since it was listed
                continue
            done.append(eid)
        return done

    def cancel(self, execution_id: str) -> CancelOutcome:
        """Cancel an execution whatever it does, and say what was done (``CancelOutcome``: its
        ``outcome``, ``describe()``, ``landed``): a start still queued (or waiting for a flow slot)
        ends ``cancelled`` without a step when a worker reads it; a running one at its next
        checkpoint (a ``completed`` result of a step running now is discarded); a suspended one as
        soon as a worker takes the ``cancel`` task enqueued for it, its children stopping at their
        next checkpoint. ExecutionNotFound when there is no execution and no start of it queued."""
        ks = self.queue.keyspace
        streams = self.queue.partition_queues()[ks.partition_of(execution_id)].level_streams()
        outcome = request_cancel(self.store, self._enqueue, execution_id, streams)
        if outcome is None:
            raise ExecutionNotFound(f"no execution {execution_id!r} and no start of it queued")
        return outcome

    def get(self, execution_id: str) -> dict[str, Any] | None:
        return self.store.get(_checked_id(execution_id))

    def events(self, execution_id: str) -> dict[str, Any]:
        """What the execution's steps published (``ctx.publish``), by name: the latest value of
        each, readable while a step runs ({} when none; they expire with the execution)."""
        return {name: record.get("value") for name, record in self.store.events(execution_id).items()}

    def get_event(self, execution_id: str, name: str, default: Any = None) -> Any:
        """The latest value published under ``name`` (``ctx.publish``), or ``default``."""
        record = self.store.event(execution_id, name)
        return default if record is None else record.get("value")

    def wait(self, execution_id: str, timeout_s: float, *, poll_s: float = WAIT_POLL_S) -> dict[str, Any]:
        """The state once terminal; WaitTimeout after ``timeout_s`` (a start not yet taken by a
        worker is ``queued``; one an older producer sent has no state yet: waiting covers both).
        ValueError for a ``timeout_s`` that is not a finite number >= 0 (NaN would wait for ever)."""
        _checked_id(execution_id)
        if not isinstance(timeout_s, int | float) or not math.isfinite(timeout_s) or timeout_s < 0:
            raise ValueError(f"timeout_s must be a finite number of seconds >= 0, not {timeout_s!r}")
        deadline_s = time.monotonic() + timeout_s
        while True:
            doc = self.store.get(execution_id)
            if doc is not None and doc.get("status") in TERMINAL:
                return doc
            left_s = deadline_s - time.monotonic()
            if left_s <= 0:
                status = doc.get("status") if doc else "not started"
                raise WaitTimeout(f"execution {execution_id} still {status} after {timeout_s} s")
            time.sleep(min(poll_s, left_s))

    def list(
        self, *, tenant: str | None = None, all_tenants: bool = False, **filters: Unpack[ListFilters]
    ) -> ExecutionPage:
        """A page of executions, newest update first, as typed rows (``ExecutionPage``: ``rows``,
        ``cursor`` for the next page, None at the end); this client's tenant's, ``tenant``'s, or
        with ``all_tenants`` every tenant's. ``filters`` (``status``, ``flow``, ``parent_id``,
        ``created_after``, ``created_before``, ``version``, ``limit``, ``cursor``,
        ``include_params``, ``include_result``), their defaults, bounds and cost:
        ``plaita.flows.producer.listing.list_executions``.
        ValueError for a bad filter, limit, tenant or cursor."""
        return list_executions(stores_of(self.store, tenant=tenant, all_tenants=all_tenants), **filters)

    def steps(self, execution_id: str, *, include_output: bool = False) -> builtins.list[StepRow]:
        """Each step the execution ran, in the order each first ran: attempts, first start, end,
        last error, and its output with ``include_output`` (``StepRow``). ExecutionNotFound."""
        return steps_of(self._require(_checked_id(execution_id)), include_output=include_output)

    def _enqueue(self, body: dict[str, Any]) -> str:
        """Enqueue ``body`` with the caller's trace context (``plaita.flows.tracing``), if any."""
        with producing([body], self.queue.keyspace.queue):
            return self.queue.enqueue(body)

    def _new_id(self, dedup_key: str | None) -> str:
        """A fresh execution id; with a dedup key and partitions, one in the dedup key's partition
        (where its dedup key lives: one script answers it and records the start), so two starts
        with one key always meet."""
        ks = self.queue.keyspace
        want = ks.partition_of(dedup_key) if dedup_key is not None else None
        for _ in range(MAX_ID_TRIES):
            eid = uuid.uuid4().hex
            if want is None or ks.partition_of(eid) == want:
                return eid
        raise AssertionError("no execution id found in the dedup key's partition")  # pragma: no cover

    def _require(self, execution_id: str) -> dict[str, Any]:
        doc = self.store.get(execution_id)
        if doc is None:
            raise ExecutionNotFound(f"no execution {execution_id!r}")
        return doc


def _checked_id(execution_id: Any) -> str:
    """``execution_id`` if it is a non-empty string (what every task body needs), else ValueError."""
    if not isinstance(execution_id, str) or not execution_id:
        raise ValueError(f"execution_id must be a non-empty string, not {execution_id!r}")
    return execution_id
