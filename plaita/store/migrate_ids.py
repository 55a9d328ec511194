"""``plaita migrate ids``: move the keys written before ids were escaped in keys (``key_id``).

Before, an id went into its keys as it was, so ``order:123``'s state was ``plaita:execution:order:123``;
now it is ``plaita:execution:order%3A123``. Only ids holding ``:`` or ``%`` change key: children
(``<parent>:<step>:<join>:<i>``) and schedule ticks (``schedule:<flow>:<tick>``) among them. Plain ids
keep their keys and are never touched.

The executions to move are found in the status indexes (their members are the ids, which did not
change), per tenant (``plaita:tenants``) and partition, so nothing is parsed out of an ambiguous old
key name. For each such id: its state (only when the document there names this id: an old key may
have been another execution's), then its events, cancel flag, fence, lease and the keeper's retry
mark, and a child's spawn done-set under its parent's escaped id. Start-dedup keys holding a ``:`` are
found with SCAN and moved the same way. Each move is ``RENAMENX`` (the TTL goes with the key): a key
already written under the new name wins and the old one is reported, not overwritten. Idempotent:
a second run finds nothing to move. Run it with the old workers stopped, before new ones start.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, cast

import redis

from plaita.store.executions.execution_docs import reply_text
from plaita.store.executions.fanout import DONE_PREFIX, done_key
from plaita.store.executions.keeper_store import KEEPER_RETRY_PREFIX
from plaita.store.keyspace import TENANTS_KEY, Keyspace, key_id
from plaita.store.stats import glob_escape
from plaita.tasks import TENANT_ID

#: The statuses whose index lists the executions to move (``plaita.store.executions.store.STATUSES``).
STATUSES = ("queued", "running", "suspended", "completed", "error", "cancelled")
#: The document field of a child's link to its parent (``plaita.flows.model.bodies.PARENT_FIELD``).
PARENT_FIELD = "parent"
#: Index members and SCAN keys asked for per call.
SCAN_COUNT = 500


@dataclass
class MigrationReport:
    """What a run moved (or, dry run, would move)."""

    #: Executions with at least one key moved.
    executions: int = 0
    #: Keys moved (renamed).
    moved: int = 0
    #: Old keys left because the new name already holds a key: (old, new).
    conflicts: list[tuple[str, str]] = field(default_factory=list)
    #: Old state keys left because the document there is another execution's.
    foreign: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "executions": self.executions,
            "moved": self.moved,
            "conflicts": [{"old": o, "new": n} for o, n in self.conflicts],
            "foreign": self.foreign,
        }


def _old(new: str, eid: str) -> str:
    """The name ``new`` (which ends with ``key_id(eid)``) had before ids were escaped."""
    return new[: len(new) - len(key_id(eid))] + eid


def _tenant_spaces(client: redis.Redis, ks: Keyspace) -> list[Keyspace]:
    members = sorted(reply_text(m) for m in cast(set[Any], client.smembers(TENANTS_KEY)))
    return [ks.for_tenant(None), *(ks.for_tenant(t) for t in members if TENANT_ID.fullmatch(t) and t != "default")]


def _moving_ids(client: redis.Redis, ks: Keyspace) -> Iterator[str]:
    """Every indexed id of ``ks``'s tenant whose keys changed (it holds ``:`` or ``%``)."""
    seen: set[str] = set()
    for p in range(len(ks.tags)):
        for status in STATUSES:
            for member, _ in client.zscan_iter(ks.status_key(p, status), match="*[:%]*", count=SCAN_COUNT):
                eid = reply_text(member)
                if eid not in seen and key_id(eid) != eid:
                    seen.add(eid)
                    yield eid


class _Mover:
    def __init__(self, client: redis.Redis, dry_run: bool, report: MigrationReport) -> None:
        self.client, self.dry_run, self.report = client, dry_run, report
        #: Old names moved (or, dry run, that would be): a spawn's done set is named by each child.
        self.gone: set[str] = set()

    def move(self, old: str, new: str) -> bool:
        if old == new or old in self.gone or not self.client.exists(old):
            return False
        if self.client.exists(new):
            self.report.conflicts.append((old, new))
            return False
        if not self.dry_run and not self.client.renamenx(old, new):
            self.report.conflicts.append((old, new))  # written meanwhile: the new one wins
            return False
        self.gone.add(old)
        self.report.moved += 1
        return True

    def state(self, ks: Keyspace, eid: str) -> dict[str, Any] | None:
        """Move the state when the old key holds this execution's document; that document."""
        new = ks.execution_key(eid)
        old = _old(new, eid)
        raw = self.client.get(old) if self.client.type(old) in (b"string", "string") else None
        try:
            doc = json.loads(raw) if raw is not None else None
        except ValueError:
            doc = None
        if not isinstance(doc, dict) or doc.get("execution_id") != eid:
            if raw is not None:
                self.report.foreign.append(old)
            return None
        self.move(old, new)
        return doc

    def execution(self, ks: Keyspace, eid: str) -> None:
        doc = self.state(ks, eid)
        moved = self.report.moved
        for new in (ks.events_key(eid), ks.cancel_key(eid), ks.fence_key(eid), ks.lease_key(eid), ks.crashes_key(eid)):
            self.move(_old(new, eid), new)
        retry = ks.named(KEEPER_RETRY_PREFIX)
        self.move(retry + eid, retry + key_id(eid))
        link = (doc or {}).get(PARENT_FIELD)
        if isinstance(link, dict) and isinstance(link.get("id"), str) and isinstance(link.get("prefix"), str):
            parent, prefix = link["id"], link["prefix"]
            new = done_key(ks, parent, prefix)
            tag = ks.slot_tag(parent)
            self.move(f"{ks.named(DONE_PREFIX)}{tag}:{prefix}" if tag else ks.named(DONE_PREFIX) + prefix, new)
        if doc is not None or self.report.moved > moved:
            self.report.executions += 1

    def dedup(self, ks: Keyspace, other_ns: list[str]) -> None:
        """Dedup keys with a ``:`` in the key part: only an old name can hold one."""
        for p in range(len(ks.tags)):
            prefix = ks.dedup_key(p, "")
            for raw in self.client.scan_iter(match=f"{glob_escape(prefix)}*:*", count=SCAN_COUNT):
                old = reply_text(raw)
                if any(old.startswith(ns + ":") for ns in other_ns):
                    continue  # another tenant's key that only looks like one of ours
                self.move(old, prefix + key_id(old[len(prefix) :]))


def migrate_ids(client: redis.Redis, ks: Keyspace, *, dry_run: bool = False) -> MigrationReport:
    """Move every key of ``ks``'s queue (every tenant, every partition) to its escaped name."""
    report = MigrationReport()
    mover = _Mover(client, dry_run, report)
    spaces = _tenant_spaces(client, ks)
    for space in spaces:
        for eid in _moving_ids(client, space):
            mover.execution(space, eid)
        mover.dedup(space, [s.ns for s in spaces if s.ns != space.ns and s.ns.startswith(space.ns + ":")])
    return report
