"""What the layers above store/ get from an opened queue instead of reaching for its client.

A queue (``StreamQueue`` or ``PartitionedQueue``) owns its client and its keyspace; code outside
store/ that needs another view of the same server (the executions, the leases, the counts an
operator sees) asks for it here, so no raw client travels up through ops/, cli/, the dashboard or
the runtime. Every function shares the queue's client: closing the queue closes what they use.
Redis failures pass through unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from plaita.store.client import delete_keys
from plaita.store.executions.crashes import CrashStrikes
from plaita.store.executions.flow_limits import waiting_starts
from plaita.store.executions.store import ExecutionStore
from plaita.store.leases import LeaseManager
from plaita.store.stats import execution_counts
from plaita.store.streams.queue import StreamQueue


def executions_of(queue: StreamQueue) -> ExecutionStore:
    """The executions stored with ``queue`` (its keyspace: partitions, hash tags)."""
    return ExecutionStore(queue.client, queue.keyspace)


def leases_of(queue: StreamQueue, *, consumer: str, ttl_s: float, lease_format: str = "v1") -> LeaseManager:
    """The leases of ``consumer``'s tasks on ``queue``, on the queue's client, written in ``lease_format``."""
    return LeaseManager(
        queue.client, consumer=consumer, ttl_s=ttl_s, keyspace=queue.keyspace, lease_format=lease_format
    )


def owner_leases_of(queue: StreamQueue, leases: LeaseManager) -> LeaseManager:
    """``leases``' holder over the queue's owner-thread pool, the one a stop may cut
    (``StreamQueue.interrupt_read``) without touching acks or renewals."""
    return leases.on(queue.owner)


def crash_strikes_of(queue: StreamQueue) -> CrashStrikes:
    """The crash-strike records of ``queue``'s tasks, read and written from the owner thread's pool."""
    return CrashStrikes(queue.owner)


def execution_counts_of(queue: StreamQueue) -> dict[str, Any]:
    """Executions per status, the default tenant's and each named tenant's (``stats.execution_counts``)."""
    return execution_counts(queue.client, queue.keyspace)


def waiting_starts_of(queue: StreamQueue) -> dict[str, int]:
    """How many starts wait for a flow slot on ``queue``, by flow."""
    return waiting_starts(queue.client, queue.keyspace)


def ping(queue: StreamQueue) -> None:
    """One PING: raises the Redis failure if the server does not answer."""
    queue.client.ping()


def delete(queue: StreamQueue, keys: list[str]) -> int:
    """DEL ``keys`` (in batches) on the queue's server; how many existed."""
    return delete_keys(queue.client, keys)


def remove_members(queue: StreamQueue, sorted_sets: Sequence[str], members: Sequence[str]) -> None:
    """ZREM ``members`` from each of ``sorted_sets``, in one pipeline (not a transaction: each
    ZREM stands alone, so a cluster may spread the sets over nodes)."""
    pipe = queue.client.pipeline(transaction=False)
    for key in sorted_sets:
        pipe.zrem(key, *members)
    pipe.execute()
