"""``Execution``: the typed execution state (``plaita:execution:{id}``) and its pure transitions.

This module owns the document. The engine advances an execution by calling one of the
transitions below (each returns a new, frozen ``Execution``); the checkpoint writes what
``encode`` returns; nothing else changes one. Pure: no Redis, no clock (times are arguments).

The stored JSON keeps one shape for every version of plaita: the field names below, with
``versions`` absent on executions stored before lineages existed and ``suspensions`` absent
until the first suspension. Fields this version does not know (a newer worker's, during a
rolling upgrade) are kept as they were and written back unchanged.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field, fields
from typing import Any

from plaita.errors import PlaitaError
from plaita.flows.model import bodies as model
from plaita.flows.model.definition import Flow
from plaita.flows.model.failures import TRACEBACK_CHARS as TRACEBACK_CHARS
from plaita.flows.model.failures import describe_exception as describe_exception
from plaita.flows.model.failures import error_doc as error_doc
from plaita.flows.model.failures import error_from_exception as error_from_exception
from plaita.flows.model.failures import exception_text as exception_text
from plaita.flows.model.failures import history_entry
from plaita.flows.model.validate import StepOutputError, dumps_document, epoch_or_none
from plaita.store.executions.store import ALL_STATUSES, QUEUED, TERMINAL

#: History entries kept per execution (the newest); ``steps_run`` keeps counting.
HISTORY_LIMIT = 200
#: Resume ids remembered per execution, so a redelivered resume is a no-op.
APPLIED_RESUMES_LIMIT = 100
#: Fields left out while they have this value (older documents lack them).
_ABSENT: dict[str, Any] = {"versions": None, "suspensions": 0, "deadline_at": None, "inbox": [], "waiting": None}
#: The ``error`` type of an execution cancelled because its whole-execution deadline passed.
DEADLINE_EXCEEDED = "DeadlineExceeded"


class BadExecution(PlaitaError, ValueError):
    """A stored document that is not an execution plaita could have written (its status)."""


@dataclass(frozen=True)
class Execution:
    """One execution's state. Frozen: transitions return a new one; treat its containers as
    read-only too (hooks receive the execution that was checkpointed)."""

    execution_id: str
    flow_id: str
    fingerprint: str | None
    version: str | None
    #: The versions this execution is at or newer than (an older worker hands it back);
    #: None for one stored before lineages existed.
    versions: list[str] | None
    status: str
    step_index: int
    step: str | None
    #: Failed attempts of the current step so far (durable: a restart keeps the retry budget).
    attempt: int
    params: dict[str, Any]
    state: dict[str, Any]
    results: dict[str, Any]
    #: What the step that suspended sees as ``ctx.resume`` when it runs again.
    resume: dict[str, Any] | None
    suspension: dict[str, Any] | None
    history: list[dict[str, Any]]
    steps_run: int
    applied_resumes: list[str]
    error: dict[str, Any] | None
    dedup_key: str | None
    created_at: float
    updated_at: float
    ended_at: float | None
    #: Suspensions so far: a timeout names the one it was armed for (0: never suspended).
    suspensions: int = 0
    #: Whole-execution deadline (epoch seconds): past it the execution is cancelled; None: none.
    deadline_at: float | None = None
    #: Resumes addressed to a wait the execution was not in yet (``plaita.flows.model.inbox``).
    inbox: list[dict[str, Any]] = field(default_factory=list)
    #: What a ``queued`` execution waits for (``{"for": "version", "version", "since", "until"}``:
    #: a worker of the version its start asks for); None: nothing but a worker.
    waiting: dict[str, Any] | None = None
    #: Fields this version does not know, written back as they were.
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if self.status not in ALL_STATUSES:
            raise BadExecution(f"execution {self.execution_id!r} has unknown status {self.status!r}")

    # -- encode / decode -------------------------------------------------------------------
    @classmethod
    def start(
        cls,
        execution_id: str,
        flow: Flow,
        params: dict[str, Any],
        *,
        dedup_key: str | None,
        now_s: float,
        deadline_at: float | None = None,
        parent: dict[str, Any] | None = None,
    ) -> Execution:
        """A new execution of ``flow``, running, at its first step (cancelled past ``deadline_at``):
        what a start task creates; a child's ``parent`` is kept in it, to tell it when it ends."""
        queued = cls.queued(execution_id, flow.flow_id, params, dedup_key=dedup_key, version=None, now_s=now_s)
        # Made here and seen by no one yet: completed in place, not copied (one per start).
        queued.__dict__.update(
            fingerprint=flow.fingerprint,
            version=flow.version,
            versions=flow.lineage(),
            status="running",
            step=flow.steps[0].name,
            deadline_at=deadline_at,
            extra={} if parent is None else {"parent": parent},
        )
        return queued

    @classmethod
    def queued(
        cls,
        execution_id: str,
        flow_id: str,
        params: dict[str, Any],
        *,
        dedup_key: str | None,
        version: str | None,
        now_s: float,
        deadline_at: float | None = None,
        due: tuple[int, str] | None = None,
    ) -> Execution:
        """The record a producer's start writes (``queued``): no step and no definition yet, only
        what the start asks for (``version``: the one requested, if any; ``due``: a delayed start's
        (due time in epoch ms, delayed task id), kept as ``waiting`` ``{"for": "due", "until":
        epoch s, "due_ms", "task"}``). A worker's create replaces it with ``start``'s execution."""
        return cls._built(
            execution_id=execution_id,
            flow_id=flow_id,
            fingerprint=None,
            version=version,
            versions=None,
            status=QUEUED,
            step_index=0,
            step=None,
            attempt=0,
            params=params,
            state={},
            results={},
            resume=None,
            suspension=None,
            history=[],
            steps_run=0,
            applied_resumes=[],
            error=None,
            dedup_key=dedup_key,
            created_at=now_s,
            updated_at=now_s,
            ended_at=None,
            suspensions=0,
            deadline_at=deadline_at,
            inbox=[],
            waiting=None if due is None else {"for": "due", "until": due[0] / 1000, "due_ms": due[0], "task": due[1]},
            extra={},
        )

    @classmethod
    def _built(cls, **values: Any) -> Execution:
        """``cls(**values)`` for every field, named in field order, without the frozen class's
        generated ``__init__`` (one ``object.__setattr__`` per field of 27: every start built one)."""
        new = object.__new__(cls)
        new.__dict__.update(values)
        new.__post_init__()
        return new

    def waiting_for_version(self, version: str, since_s: float, until_s: float, now_s: float) -> Execution:
        """Still ``queued``: its start waits for a live worker of ``version`` until ``until_s``."""
        waiting = {"for": "version", "version": version, "since": since_s, "until": until_s}
        return self.changed(waiting=waiting, updated_at=now_s)

    def dead_lettered(self, reason: str, now_s: float) -> Execution:
        """A ``queued`` execution whose start went to the DLQ: ended ``error`` with the reason
        (``plaita dlq requeue`` sends the start again; a worker's create then replaces it)."""
        error = error_doc(None, "DeadLettered", reason)
        return self.changed(status="error", error=error, ended_at=now_s, updated_at=now_s)

    @classmethod
    def decode(cls, doc: dict[str, Any]) -> Execution:
        """The execution a stored document holds (every document any plaita version wrote);
        BadExecution when its status is none of ``ALL_STATUSES``."""
        try:
            return cls._decode(doc)
        except (TypeError, ValueError) as exc:
            if isinstance(exc, BadExecution):
                raise
            raise BadExecution(f"execution {doc.get('execution_id')!r} has a malformed field: {exc}") from None

    @classmethod
    def _decode(cls, doc: dict[str, Any]) -> Execution:
        known = {f.name for f in fields(cls)} - {"extra"}
        versions = doc.get("versions")
        return cls._built(  # every field, in order
            execution_id=str(doc.get("execution_id")),
            flow_id=str(doc.get("flow_id")),
            fingerprint=doc.get("fingerprint"),
            version=doc.get("version"),
            versions=list(versions) if isinstance(versions, list) else None,
            status=str(doc.get("status")),
            step_index=int(doc.get("step_index") or 0),
            step=doc.get("step"),
            attempt=int(doc.get("attempt") or 0),
            params=doc.get("params") or {},
            state=doc.get("state") or {},
            results=doc.get("results") or {},
            resume=doc.get("resume") if isinstance(doc.get("resume"), dict) else None,
            suspension=doc.get("suspension") if isinstance(doc.get("suspension"), dict) else None,
            history=list(doc.get("history") or [])[-HISTORY_LIMIT:],
            steps_run=int(doc.get("steps_run") or 0),
            applied_resumes=list(doc.get("applied_resumes") or []),
            error=doc.get("error"),
            dedup_key=doc.get("dedup_key"),
            created_at=float(doc.get("created_at") or 0.0),
            updated_at=float(doc.get("updated_at") or 0.0),
            ended_at=doc.get("ended_at"),
            suspensions=int(doc.get("suspensions") or 0),
            deadline_at=epoch_or_none(doc.get("deadline_at")),
            inbox=[e for e in doc.get("inbox") or [] if isinstance(e, dict)],
            waiting=doc.get("waiting") if isinstance(doc.get("waiting"), dict) else None,
            extra={k: v for k, v in doc.items() if k not in known},
        )

    def changed(self, **changes: Any) -> Execution:
        """This execution with ``changes`` (field names), as ``dataclasses.replace`` gives it,
        at a tenth of its cost: ``replace`` runs the generated ``__init__`` (one
        ``object.__setattr__`` per field of a frozen class) for every one of the 27 fields, and
        every checkpoint made two. The fields are copied as they are; only a new ``status`` is
        checked (the one check ``__post_init__`` makes)."""
        if not _FIELD_NAMES.issuperset(changes):
            unknown = sorted(set(changes) - _FIELD_NAMES)
            raise TypeError(f"Execution has no field {unknown[0]!r}")
        return self._derived(changes)

    def _derived(self, changes: dict[str, Any]) -> Execution:
        """``changed`` for names known to be fields (this module's transitions)."""
        new = object.__new__(type(self))
        values = new.__dict__
        values.update(self.__dict__)
        values.update(changes)
        if "status" in changes:
            new.__post_init__()
        return new

    def to_doc(self) -> dict[str, Any]:
        """The stored document (a new dict; its values are this execution's own)."""
        values = self.__dict__
        if len(values) == _FIELD_COUNT:  # every field, in order (``__init__``, ``changed``): one copy
            doc = values.copy()
            del doc["extra"]
        else:
            doc = {name: values[name] for name in _DOC_FIELDS}
        for name, absent in _ABSENT.items():
            if doc[name] == absent:
                del doc[name]
        if self.extra:
            doc.update(self.extra)  # as {**doc, **extra}: a known name keeps its place
        return doc

    def encode(self) -> str:
        """Strict JSON (no NaN or Infinity: every parser must read it). TypeError or ValueError
        when a value is not JSON."""
        return dumps_document(self.to_doc())

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    @property
    def traceparent(self) -> str | None:
        """The trace every task of this execution joins (``plaita.flows.tracing``), once it has one."""
        value = self.extra.get(model.TRACEPARENT)
        return value if isinstance(value, str) else None

    def traced(self, traceparent: str) -> Execution:
        """This execution with its trace origin (kept in ``extra``, which every version writes back)."""
        return self.changed(extra={**self.extra, model.TRACEPARENT: traceparent})

    # -- transitions (each returns the next execution) -------------------------------------
    def stamped(self, now_s: float) -> Execution:
        return self._derived({"updated_at": now_s})  # every checkpoint's: no keyword dict, no name check

    def upgraded(self, flow: Flow, step_index: int) -> Execution:
        """Moved to ``flow``'s definition (a compatible version), keeping its lineage."""
        earlier = self.versions if self.versions is not None else [self.version]
        return self.changed(
            step_index=step_index,
            fingerprint=flow.fingerprint,
            version=flow.version,
            versions=flow.lineage(earlier),
        )

    def resumed(self, resume_type: str, data: Any, resume_id: str, now_s: float | None = None) -> Execution:
        """Running again: the suspended step runs again and sees ``ctx.resume``. With ``now_s``
        the history records which resume the step took (``executions show``)."""
        history = self.history
        if now_s is not None:
            entry = history_entry(str(self.step), 0, now_s, now_s, "resumed")
            wait_for = (self.suspension or {}).get("wait_for")
            entry.update(resume_id=resume_id, resume_type=resume_type, **({"wait_for": wait_for} if wait_for else {}))
            history = [*history, entry][-HISTORY_LIMIT:]
        return self.changed(
            status="running",
            resume=_resume_doc(resume_type, data, (self.suspension or {}).get("wait_for")),
            suspension=None,
            history=history,
            applied_resumes=[*self.applied_resumes, resume_id][-APPLIED_RESUMES_LIMIT:],
        )

    # -- durable sleep and restart (docs/flows.md, "Durable sleep", "Retry from a step") ---
    def sleeping(
        self,
        step: str,
        state: dict[str, Any],
        next_step: str | None,
        attempt: int,
        started_s: float,
        now_s: float,
        until_s: float,
    ) -> Execution:
        """``step`` returned ``ctx.sleep``: done (result None, state kept), suspended until
        ``until_s``; then ``next_step`` runs (None: the execution completes)."""
        seq = self.suspensions + 1
        suspension = {"seq": seq, "step": step, "since": now_s, "deadline": until_s, "kind": "sleep", "next": next_step}
        return self._ran(
            history_entry(step, attempt, started_s, now_s, "sleep"),
            state=state,
            attempt=0,
            resume=None,
            results={**self.results, step: None},
            suspensions=seq,
            status="suspended",
            suspension=suspension,
        )

    @property
    def sleeping_now(self) -> bool:
        return self.status == "suspended" and (self.suspension or {}).get("kind") == "sleep"

    def woke(self, next_step: tuple[int, str] | None, resume_id: str, now_s: float) -> Execution:
        """A sleep ended: on to ``next_step`` (index, name) with no ``ctx.resume``, or completed."""
        applied = [*self.applied_resumes, resume_id][-APPLIED_RESUMES_LIMIT:]
        woken = self.changed(resume=None, suspension=None, applied_resumes=applied)
        if next_step is None:
            return woken.changed(status="completed", ended_at=now_s)
        return woken.changed(status="running", step_index=next_step[0], step=next_step[1])

    def restarted(self, step: tuple[int, str], dropped: list[str], resume_id: str, by: str, now_s: float) -> Execution:
        """Back to ``running`` at ``step`` (index, name) from a terminal status: the results of
        the steps in ``dropped`` (the step and those after it) are forgotten, the state is kept
        as it is, the retry budget starts over; the history records who restarted it, when."""
        entry = history_entry(step[1], 0, now_s, now_s, "restarted")
        entry.update(from_status=self.status, by=by)
        return self.changed(
            status="running",
            step_index=step[0],
            step=step[1],
            attempt=0,
            resume=None,
            suspension=None,
            error=None,
            ended_at=None,
            deadline_at=None,  # an operator's restart runs without the deadline it ran out of
            results={k: v for k, v in self.results.items() if k not in dropped},
            history=[*self.history, entry][-HISTORY_LIMIT:],
            applied_resumes=[*self.applied_resumes, resume_id][-APPLIED_RESUMES_LIMIT:],
        )

    def _ran(self, entry: dict[str, Any], **changes: Any) -> Execution:
        """One more run of a step recorded in the history (the newest ``HISTORY_LIMIT`` kept)."""
        history = [*self.history, entry]
        if len(history) > HISTORY_LIMIT:
            del history[:-HISTORY_LIMIT]
        changes["history"], changes["steps_run"] = history, self.steps_run + 1
        return self._derived(changes)  # the transitions' own field names: no check

    def step_done(
        self,
        step: str,
        value: Any,
        state: dict[str, Any],
        next_step: tuple[int, str] | None,
        attempt: int,
        started_s: float,
        now_s: float,
    ) -> Execution:
        """``step`` returned ``value``: on to ``next_step`` (index, name), or completed when None."""
        merged = {**state, **value} if isinstance(value, dict) else state
        entry = history_entry(step, attempt, started_s, now_s, "ok")
        ended = {"status": "completed", "ended_at": now_s}  # one replace per step: every checkpoint's path
        where = ended if next_step is None else {"status": "running", "step_index": next_step[0], "step": next_step[1]}
        return self._ran(entry, state=merged, attempt=0, resume=None, results={**self.results, step: value}, **where)

    def suspended(
        self,
        step: str,
        state: dict[str, Any],
        attempt: int,
        started_s: float,
        now_s: float,
        deadline_s: float | None,
        wait_for: str | None = None,
    ) -> Execution:
        """``step`` suspended: waits for a resume (addressed to ``wait_for``, when named; or
        ``deadline_s``) to run it again."""
        seq = self.suspensions + 1
        suspension = {"seq": seq, "step": step, "since": now_s, "deadline": deadline_s}
        return self._ran(
            history_entry(step, attempt, started_s, now_s, "suspended"),
            state=state,
            attempt=0,
            resume=None,
            suspensions=seq,
            status="suspended",
            suspension=suspension if wait_for is None else {**suspension, "wait_for": wait_for},
        )

    def retrying(self, step: str, attempt: int, started_s: float, now_s: float, problem: str) -> Execution:
        """Attempt ``attempt`` of ``step`` failed; the step runs again (the budget is durable)."""
        return self._ran(history_entry(step, attempt, started_s, now_s, "failed", problem), attempt=attempt)

    def failed(
        self, step: str, attempt: int, started_s: float, now_s: float, problem: str, error: dict[str, Any]
    ) -> Execution:
        """``step`` failed for good: the execution ends in ``error``."""
        entry = history_entry(step, attempt, started_s, now_s, "error", problem)
        return self._ran(entry, attempt=attempt, error=error, status="error", ended_at=now_s)

    def ended(self, status: str, now_s: float, *, error: dict[str, Any] | None = None) -> Execution:
        """Ended without running a step (cancelled; refused as changed): ``status`` at ``now_s``."""
        return self.changed(status=status, ended_at=now_s, error=error if error is not None else self.error)

    def cancelled(self, now_s: float) -> Execution:
        """Ended ``cancelled``; past its deadline with why (``error`` type ``DeadlineExceeded``)."""
        if self.deadline_at is None or not self.past_deadline(now_s):
            return self.ended("cancelled", now_s)
        when = datetime.datetime.fromtimestamp(self.deadline_at, tz=datetime.UTC).isoformat(timespec="seconds")
        message = f"deadline exceeded: the execution had to end by {when}"
        return self.ended("cancelled", now_s, error=error_doc(self.step, DEADLINE_EXCEEDED, message))

    def too_large(self, size: int, limit: int, after_step: str | None) -> Execution:
        """The ``error`` execution replacing one whose document is over ``limit`` bytes: without
        its state, results and resume (small enough to write, so the failure is recorded)."""
        message = f"state is {size} bytes after step {after_step!r}, over the {limit}-byte limit"
        error = error_doc(self.step, "StateTooLarge", message)
        return self.changed(state={}, results={}, resume=None, error=error, status="error")

    def unwritable(self, problem: StepOutputError) -> Execution:
        """The ``error`` execution replacing one that is not strict JSON (a state stored before
        JSON was strict): without its state, instead of failing every checkpoint forever."""
        error = error_doc(self.step, problem.kind, str(problem))
        return self.changed(state={}, results={}, resume=None, status="error", error=error, ended_at=self.updated_at)

    # -- questions ------------------------------------------------------------------------
    def past_deadline(self, now_s: float) -> bool:
        """Whether the whole-execution deadline has passed (never, without one)."""
        return self.deadline_at is not None and now_s >= self.deadline_at

    def stale_timeout(self, suspension_seq: Any) -> bool:
        """A timeout (armed for suspension ``suspension_seq``, None = any) of a suspension that
        already ended: resumed, maybe suspended again."""
        if self.status != "suspended" or self.suspension is None:
            return True
        return suspension_seq is not None and suspension_seq != self.suspension.get("seq")


#: The stored document's fields in order (``to_doc``; ``extra`` merged after them).
_DOC_FIELDS = tuple(f.name for f in fields(Execution) if f.name != "extra")
#: Every field's name (``Execution.changed`` refuses any other, as ``dataclasses.replace`` does).
_FIELD_NAMES = frozenset(f.name for f in fields(Execution))
#: How many entries an execution's ``__dict__`` holds: one per field.
_FIELD_COUNT = len(_FIELD_NAMES)


def _resume_doc(resume_type: str, data: Any, wait_for: Any) -> dict[str, Any]:
    """The ``resume`` a resumed step sees; ``wait_for`` the wait it ended (what ``ctx.recv`` checks)."""
    doc: dict[str, Any] = {"type": resume_type, "data": data}
    if isinstance(wait_for, str) and wait_for:
        doc["wait_for"] = wait_for
    return doc
