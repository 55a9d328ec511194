"""Deleting executions and finding the ended ones to prune (``plaita.flows.retention``).

Every key an execution owns, by ``Keyspace`` (its tenant's namespace, its partition's tag):

- its document, cancel flag, published events, lease and fence, crash strikes and version wait
  (``execution_key``, ``cancel_key``, ``events_key``, ``lease_key``, ``fence_key``,
  ``crashes_key``, ``version_wait_key``), all in its slot;
- the keeper's retry mark (``plaita:execution:keeper-retry:<id>``, untagged);
- the done sets of its spawns (``plaita:execution:children:{tag}:<id>:<step>:<k>``: the caller
  names the spawns, from the document's join counts);
- the start dedup key its document names, only while it still names this execution;
- its members in its partition's status indexes (every status) and deadline index.

Its children are executions of their own (ids ``<id>:<step>:<k>:<i>``) and are not deleted with it.
The deletes are one non-transactional pipeline (keys of several slots on a cluster), the document
last: a delete cut short by a fault leaves the document, so it can be deleted again.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, cast

from plaita.store import scripts
from plaita.store.executions.execution_docs import reply_text
from plaita.store.executions.fanout import done_key
from plaita.store.executions.keeper_store import KEEPER_RETRY_PREFIX
from plaita.store.executions.store import ALL_STATUSES, ExecutionStore
from plaita.store.keyspace import key_id

FORGET_DEDUP = scripts.script("forget_dedup")


def owned_keys(store: ExecutionStore, execution_id: str, spawn_prefixes: Iterable[str] = ()) -> list[str]:
    """The keys ``execution_id`` owns (not its index entries nor its dedup key), document first."""
    ks = store.ks
    keys = [
        ks.execution_key(execution_id),
        ks.cancel_key(execution_id),
        ks.events_key(execution_id),
        ks.lease_key(execution_id),
        ks.fence_key(execution_id),
        ks.crashes_key(execution_id),
        ks.version_wait_key(execution_id),
        ks.named(KEEPER_RETRY_PREFIX) + key_id(execution_id),
    ]
    return keys + [done_key(ks, execution_id, prefix) for prefix in spawn_prefixes]


def delete_execution(
    store: ExecutionStore, execution_id: str, *, dedup_key: str | None = None, spawn_prefixes: Sequence[str] = ()
) -> bool:
    """Delete every key and index entry of ``execution_id`` (see the module doc); True when its
    document was there. Idempotent: a second call deletes nothing and returns False."""
    return delete_executions(store, [(execution_id, dedup_key, spawn_prefixes)])[0]


def delete_executions(store: ExecutionStore, items: Sequence[tuple[str, str | None, Sequence[str]]]) -> list[bool]:
    """``delete_execution`` of each (id, dedup key, spawn prefixes) in one pipeline (a prune
    batch: one round trip, not one per execution); whether each document was there."""
    ks = store.ks
    for execution_id, dedup_key, _ in items:
        if dedup_key:  # compare-and-delete: a script of its own, only for those that have one
            FORGET_DEDUP(store.client, [ks.dedup_key(ks.partition_of(dedup_key), dedup_key)], [execution_id])
    pipe = store.client.pipeline(transaction=False)
    for execution_id, _, prefixes in items:
        p = ks.partition_of(execution_id)
        keys = owned_keys(store, execution_id, prefixes)
        for key in keys[1:]:
            pipe.delete(key)
        for status in ALL_STATUSES:
            pipe.zrem(ks.status_key(p, status), execution_id)
        pipe.zrem(ks.deadlines_key(p), execution_id)
        pipe.delete(keys[0])  # last: cut short, the document is still there to delete again
    replies = pipe.execute()
    out, at = [], 0
    for execution_id, _, prefixes in items:
        at += len(owned_keys(store, execution_id, prefixes)) + len(ALL_STATUSES) + 1
        out.append(int(replies[at - 1]) == 1)
    return out


def ended_before(
    store: ExecutionStore, statuses: Sequence[str], before_s: float, limit: int, skip: dict[tuple[str, int], int]
) -> list[tuple[str, int, str]]:
    """At most ``limit`` (status, partition, id) whose index score (the time of their last write:
    for an ended execution, its end) is before ``before_s``, oldest first per index; ``skip``:
    entries to pass over per (status, partition) (those a caller chose to keep)."""
    out: list[tuple[str, int, str]] = []
    for status in statuses:
        for p in range(len(store.ks.tags)):
            left = limit - len(out)
            if left <= 0:
                return out
            key = store.ks.status_key(p, status)
            raw = store.client.zrangebyscore(key, "-inf", f"({before_s!r}", start=skip.get((status, p), 0), num=left)
            out += [(status, p, reply_text(m)) for m in cast(list[Any], raw)]
    return out


def count_ended_before(store: ExecutionStore, statuses: Sequence[str], before_s: float) -> int:
    """How many index entries of ``statuses`` are before ``before_s`` (ZCOUNT: no document read)."""
    pipe = store.client.pipeline(transaction=False)
    for status in statuses:
        for p in range(len(store.ks.tags)):
            pipe.zcount(store.ks.status_key(p, status), "-inf", f"({before_s!r}")
    return sum(int(n) for n in pipe.execute())


def drop_index_entry(store: ExecutionStore, status: str, partition: int, execution_id: str) -> None:
    """Remove a stale entry (its document is in another status now) from one status index."""
    store.client.zrem(store.ks.status_key(partition, status), execution_id)
