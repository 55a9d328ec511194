"""Retention: delete executions, prune the ended ones, cancel many by a filter.

``delete`` removes an ended execution and every key it owns (``plaita.store.retention`` lists
them); a queued, running or suspended one is refused unless ``force``: then it is cancelled first,
and deleted once it has ended (within ``timeout_s``). ``prune`` deletes the executions that ended
before a time, found through the status indexes in bounded batches (a run cut short is resumed by
running it again). ``cancel_many`` cancels the executions a status (and flow) filter selects,
``resume_many`` resumes the suspended ones (in a wait of a given name, when asked) the same way.
The retention of an ended execution (its TTL) is the flow's ``retention_s`` (default 7 days).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from plaita.errors import PlaitaError
from plaita.flows.model.bodies import JOINS_FIELD
from plaita.flows.model.definition import Flow
from plaita.store.executions.execution_docs import UnreadableExecution
from plaita.store.executions.store import TERMINAL, ExecutionStore
from plaita.store.retention import count_ended_before, delete_executions, drop_index_entry, ended_before


class _Flows(Protocol):
    """What ``delete`` uses of a ``FlowClient`` (its tenant's store and its cancel)."""

    @property
    def store(self) -> ExecutionStore: ...

    def cancel(self, execution_id: str) -> Any: ...


#: Statuses ``prune`` deletes by default: every ended one.
ENDED = ("completed", "error", "cancelled")
#: Statuses ``cancel_many`` selects by default: every one not ended.
NOT_ENDED = ("queued", "running", "suspended")
#: Executions one prune batch reads and deletes.
PRUNE_BATCH = 500
#: Statuses ``resume_many`` selects: only a suspended execution waits for a resume.
RESUMABLE = ("suspended",)
#: Executions ``cancel_many`` (and ``resume_many``) selects at most (``limit``).
CANCEL_MANY_LIMIT = 1000
#: Spawn done sets deleted per execution at most (a step that spawned in a loop).
MAX_SPAWNS = 10_000
#: Polling interval while ``delete(force=True)`` waits for a cancelled execution to end.
POLL_S = 0.05


class NotDeletable(PlaitaError):
    """A delete refused: the execution has not ended (pass force to cancel it first), or it did
    not end within the timeout after its cancel."""


@dataclass(frozen=True)
class Deleted:
    """What ``delete`` did to one id: ``deleted`` (keys gone), ``missing`` (no document: its
    leftover keys are deleted anyway) or ``cancelled_and_deleted`` (force: it had not ended)."""

    execution_id: str
    outcome: str
    #: Its status when the delete was asked for (before a forced cancel); None: no document.
    status: str | None = None


@dataclass
class Pruned:
    """What ``prune`` did: ``deleted`` ids (or, dry run, the count of ``matched`` index entries),
    ``kept`` entries passed over (unreadable documents, or documents not ended any more)."""

    matched: int = 0
    deleted: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    #: True when ``limit`` stopped it before every match was deleted (run it again to go on).
    more: bool = False


def index_keep_s(flows: Iterable[Flow], default_s: int) -> int:
    """How long the status indexes keep ended entries for a worker running ``flows``: the longest
    retention among them (0, for ever, if any keeps its executions for ever)."""
    kept = [default_s, *(default_s if f.retention_s is None else f.retention_s for f in flows)]
    return 0 if 0 in kept else max(kept)


def spawn_prefixes(doc: dict[str, Any] | None, execution_id: str) -> list[str]:
    """The prefixes of every spawn an execution made (its done sets), from its join counts."""
    joins = (doc or {}).get(JOINS_FIELD)
    out: list[str] = []
    for step, n in joins.items() if isinstance(joins, dict) else []:
        count = n if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else 0
        out += [f"{execution_id}:{step}:{k}" for k in range(min(count, MAX_SPAWNS) + 1)]
    return out[:MAX_SPAWNS]


def _deletion(execution_id: str, doc: dict[str, Any] | None) -> tuple[str, str | None, Sequence[str]]:
    """(id, dedup key, spawn prefixes): what ``delete_executions`` needs of one execution."""
    dedup = (doc or {}).get("dedup_key")
    return execution_id, dedup if isinstance(dedup, str) else None, spawn_prefixes(doc, execution_id)


def _delete_doc(store: ExecutionStore, execution_id: str, doc: dict[str, Any] | None) -> bool:
    return delete_executions(store, [_deletion(execution_id, doc)])[0]


def delete(
    flows: _Flows, execution_ids: Iterable[str], *, force: bool = False, timeout_s: float = 60.0
) -> list[Deleted]:
    """Delete each execution (see the module doc); refused ones raise NotDeletable before any of
    the others is deleted, unless ``force``. UnreadableExecution for a key that holds none."""
    ids = list(dict.fromkeys(execution_ids))
    docs = {eid: flows.store.get(eid) for eid in ids}
    live = [eid for eid, doc in docs.items() if doc is not None and doc.get("status") not in TERMINAL]
    if live and not force:
        which = ", ".join(f"{e} ({docs[e].get('status')})" for e in live[:5])  # type: ignore[union-attr]
        raise NotDeletable(f"not ended: {which}; nothing deleted (force / --force cancels them first)")
    was = {eid: str(docs[eid].get("status")) for eid in live}  # type: ignore[union-attr]
    for eid in live:
        flows.cancel(eid)
    for eid in live:
        docs[eid] = _ended(flows, eid, timeout_s)
    out: list[Deleted] = []
    for eid in ids:
        doc = docs[eid]
        existed = _delete_doc(flows.store, eid, doc)
        status = was.get(eid) or (None if doc is None else str(doc.get("status")))
        outcome = "cancelled_and_deleted" if eid in live else ("deleted" if existed else "missing")
        out.append(Deleted(eid, outcome, status))
    return out


def _ended(flows: _Flows, execution_id: str, timeout_s: float) -> dict[str, Any] | None:
    """The document once ended (None if it is gone); NotDeletable when not ended by ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        doc = flows.store.get(execution_id)
        if doc is None or doc.get("status") in TERMINAL:
            return doc
        if time.monotonic() >= deadline:
            raise NotDeletable(
                f"execution {execution_id} is still {doc.get('status')} {timeout_s} s after its cancel; "
                "not deleted (the cancel stays recorded: delete it once it has ended)"
            )
        time.sleep(POLL_S)


def prune(
    store: ExecutionStore,
    ended_before_s: float,
    *,
    statuses: Sequence[str] = ENDED,
    dry_run: bool = False,
    limit: int | None = None,
    batch: int = PRUNE_BATCH,
) -> Pruned:
    """Delete the executions of ``statuses`` (ended ones only) whose end is before
    ``ended_before_s`` (epoch seconds), ``batch`` at a time, at most ``limit`` (None: all).
    ``dry_run``: count them (``matched``), delete nothing."""
    bad = [s for s in statuses if s not in ENDED]
    if bad:
        raise ValueError(f"prune deletes ended executions only ({', '.join(ENDED)}), not {', '.join(bad)}")
    result = Pruned(matched=count_ended_before(store, statuses, ended_before_s))
    if dry_run:
        return result
    skip: dict[tuple[str, int], int] = {}
    while limit is None or len(result.deleted) < limit:
        want = batch if limit is None else min(batch, limit - len(result.deleted))
        rows = ended_before(store, statuses, ended_before_s, want, skip)
        if not rows:
            return result
        doomed: list[tuple[str, str | None, Sequence[str]]] = []
        for (status, p, eid), doc in zip(rows, store.read_many([e for _, _, e in rows]), strict=True):
            if isinstance(doc, UnreadableExecution):  # data for an operator: never deleted here
                skip[(status, p)] = skip.get((status, p), 0) + 1
                result.kept.append(eid)
            elif doc is not None and doc.get("status") != status:  # a stale entry: it runs again
                drop_index_entry(store, status, p, eid)
                result.kept.append(eid)
            else:
                doomed.append(_deletion(eid, doc))
        delete_executions(store, doomed)  # the batch in one round trip
        result.deleted += [eid for eid, _, _ in doomed]
    result.more = bool(ended_before(store, statuses, ended_before_s, 1, skip))
    return result


def check_statuses(statuses: Sequence[str], allowed: Sequence[str], which: str) -> None:
    """ValueError unless every status is one of ``allowed``; ``which``: the executions that can
    be steered so ("not ended ones can be cancelled")."""
    bad = [s for s in statuses if s not in allowed]
    if bad:
        raise ValueError(f"only {which} ({', '.join(allowed)}), not {', '.join(bad)}")


def waits_for_resume(doc: dict[str, Any], wait_for: str | None) -> bool:
    """``doc`` is suspended in a wait a resume ends (not a sleep, not a join of its children),
    named ``wait_for`` when given: what ``resume_many`` selects."""
    suspension = doc.get("suspension")
    if doc.get("status") != "suspended" or not isinstance(suspension, dict):
        return False
    if suspension.get("kind") == "sleep" or isinstance(suspension.get("children"), dict):
        return False
    return wait_for is None or suspension.get("wait_for") == wait_for


def select(
    store: ExecutionStore,
    statuses: Sequence[str],
    flow_id: str | None,
    limit: int,
    where: Callable[[dict[str, Any]], bool] | None = None,
) -> list[dict[str, Any]]:
    """Up to ``limit`` documents of ``statuses`` (of ``flow_id`` only, when given; only those
    ``where`` accepts, when given), newest first: what ``FlowClient.cancel_many`` cancels and
    ``resume_many`` resumes (the callers check the statuses: ``check_statuses``)."""
    out: list[dict[str, Any]] = []
    seen: set[Any] = set()
    counts = store.counts()
    for status in statuses:
        for offset in range(0, counts.get(status, 0), PRUNE_BATCH):  # pages of the index, newest first
            if len(out) >= limit:
                break
            docs, _ = store.listing(status, PRUNE_BATCH, offset=offset)
            fresh = [
                d
                for d in docs
                if flow_id in (None, d.get("flow_id"))
                and d.get("execution_id") not in seen
                and (where is None or where(d))
            ]
            seen.update(d.get("execution_id") for d in fresh)
            out += fresh[: limit - len(out)]
    return out
