"""What the layers above store/ get from an opened queue instead of reaching for its client.

A queue (``StreamQueue`` or ``PartitionedQueue``) owns its client and its keyspace; code outside
store/ that needs another view of the same server (the executions, the leases, the counts an
operator sees) asks for it here, so no raw client travels up through ops/, cli/, the dashboard or
the runtime. Every function shares the queue's client: closing the queue closes what they use.
Redis failures pass through unchanged. ``open_producer_queue`` opens the queue a producer client
(``FlowClient.from_url``, ``TaskClient.from_url``) builds for itself; ``QueueClient`` is what such
a client does with it (close it only when it opened it).
"""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType
from typing import Any, Self, TypedDict, Unpack

from plaita.config import DEFAULT_REDIS_URL, Settings
from plaita.store.client import delete_keys, make_client
from plaita.store.executions.crashes import CrashStrikes
from plaita.store.executions.flow_limits import waiting_starts
from plaita.store.executions.store import ExecutionStore
from plaita.store.leases import LeaseManager
from plaita.store.stats import execution_counts
from plaita.store.streams.partitioned import open_queue
from plaita.store.streams.queue import StreamQueue

#: Socket timeout of a producer's own queue: a producer call to a frozen server fails in seconds
#: (a web request must not hang on it), where a worker's own timeout is longer.
PRODUCER_SOCKET_TIMEOUT_S = 5.0


class QueueSettings(TypedDict, total=False):
    """Which queue a producer opens (``Settings`` fields; their defaults are Settings')."""

    queue_name: str
    partitions: int
    tls_ca_file: str | None
    tls_cert_file: str | None
    tls_key_file: str | None


class QueueOptions(QueueSettings, total=False):
    """What ``FlowClient.from_url`` and ``TaskClient.from_url`` pass on to ``open_producer_queue``."""

    socket_timeout_s: float


def open_producer_queue(
    url: str = DEFAULT_REDIS_URL,
    *,
    socket_timeout_s: float = PRODUCER_SOCKET_TIMEOUT_S,
    **settings: Unpack[QueueSettings],
) -> StreamQueue:
    """The queue ``queue_name`` (default ``DEFAULT_QUEUE_NAME``) at ``url`` (``redis://``, ``rediss://``,
    ``redis+sentinel://``, ``redis+cluster://``) on a client of its own (the caller closes the
    queue); ``queue_name`` and ``partitions`` (default 1) must be the workers'; ``tls_ca_file``,
    ``tls_cert_file``, ``tls_key_file`` as for a worker. Connects lazily (never raises for Redis
    down); ConfigError for a bad URL or an unreadable TLS file."""
    config = Settings(redis_url=url, **settings)
    client = make_client(url, socket_timeout_s=socket_timeout_s, tls=config.tls)
    return open_queue(config, client=client)


class QueueClient:
    """A producer client over one queue (``self.queue``): ``close`` (or leaving a ``with``)
    releases the queue's connections only when this client opened them (``owning``); a queue the
    caller passed in is left to them."""

    def __init__(self, queue: StreamQueue) -> None:
        self.queue = queue
        #: Whether ``close`` releases the queue's connections (only those ``from_url`` opened).
        self._owns_queue = False

    def owning(self) -> Self:
        """This client, now the owner of its queue (``from_url``, which opened it)."""
        self._owns_queue = True
        return self

    def close(self) -> None:
        """Release the connections ``from_url`` opened; a queue the caller passed in is left to them."""
        if self._owns_queue:
            self.queue.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


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
