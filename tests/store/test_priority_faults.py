"""Priorities under faults (a review of the merged feature found each of these): a partitioned
worker whose level streams lost their group after a restart without data reads again after its
``ensure_group``; a hand-back of entries on several levels is one transaction, so the settler's
retry after a failure cannot re-add an entry twice; a lagging durable enqueue names its entries'
levels. A real private redis-server."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from plaita.config import Settings
from plaita.runtime.outcomes import HANDBACK, Outcome
from plaita.runtime.settler import Settler
from plaita.store.keyspace import level_stream
from plaita.store.streams import queue as queue_module
from plaita.store.streams.entries import Entry, ReplicationLagError
from plaita.store.streams.levels import LeveledQueue
from plaita.store.streams.partitioned import open_queue
from plaita.store.streams.queue import StreamQueue
from tests.support.lease_workers import wait_for

pytestmark = pytest.mark.redis

QUEUE = "plaita:test:prio-faults"
WAIT_S = 10.0


@pytest.fixture
def opened(redis_url: str) -> Iterator[Callable[..., StreamQueue]]:
    """``opened(consumer, **settings)``: a queue on the private server, closed after the test."""
    queues: list[StreamQueue] = []

    def open_one(consumer: str, **changes: Any) -> StreamQueue:
        queues.append(open_queue(Settings(redis_url=redis_url, queue_name=QUEUE, consumer_name=consumer, **changes)))
        return queues[-1]

    yield open_one
    for q in queues:
        q.close()


@pytest.mark.parametrize("partitions", [1, 3])
def test_a_worker_reads_again_after_its_level_groups_were_lost(
    opened: Callable[..., StreamQueue], rclient: redis.Redis, partitions: int
) -> None:
    """Before the fix a partitioned worker's ensure_group recreated level 0's group only: every
    read failed with NOGROUP on the level stream, level 0's tasks too, until a restart."""
    producer, q = opened("p", partitions=partitions), opened("c1", partitions=partitions)
    q.ensure_group()
    producer.enqueue({"type": "start", "flow_id": "f", "execution_id": "e1"}, priority=5)
    first = _read_all(q, 1)
    q.settle([e.message_id for e in first], [])
    rclient.flushall()  # Redis restarted without its data
    opened("p2", partitions=partitions).enqueue({"type": "start", "flow_id": "f", "execution_id": "e2"})
    with pytest.raises(redis.ResponseError, match="NOGROUP"):
        q.read_new(10, 0)
    assert q.ensure_group()  # what the worker does on NOGROUP (its BACKOFF)
    [again] = _read_all(q, 1)
    assert "/5/" not in again.message_id and not again.message_id.startswith("5/")  # level 0's task


def _read_all(q: StreamQueue, want: int) -> list[Entry]:
    got: list[Entry] = []

    def more() -> bool:
        got.extend(q.read_new(10, 0))
        return len(got) >= want

    wait_for(more, WAIT_S, f"{want} entries read")
    return got


def test_a_hand_back_over_two_levels_is_one_transaction_and_its_retry_adds_no_copy(
    opened: Callable[..., StreamQueue], rclient: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before the fix each level was its own transaction: level 0's committed, the connection
    dropped before level 3's, and the settler's retry of the batch re-added level 0's task again."""
    producer, q = opened("p"), opened("c1")
    assert isinstance(q, LeveledQueue)
    producer.enqueue({"n": 0})
    producer.enqueue({"n": 3}, priority=3)
    q.ensure_group()
    entries = _read_all(q, 2)
    monkeypatch.setattr(LeveledQueue, "supports_xnack", lambda self: False)  # the re-add way (no XNACK)
    real, calls = StreamQueue._hand_back, []

    def drops_once(self: StreamQueue, client: redis.Redis, *rest: Any) -> None:
        calls.append(sorted(mid.count("/") for mid, _ in rest[0]))
        if len(calls) == 1:
            raise redis.ConnectionError("connection dropped before EXEC (injected)")
        real(self, client, *rest)

    monkeypatch.setattr(queue_module.StreamQueue, "_hand_back", drops_once)
    failures: list[BaseException] = []
    settler = Settler(q, on_failure=failures.append, max_defer_s=0.2)
    settler.start()
    try:
        settler.put_many([Outcome(e.message_id, HANDBACK, fields=e.fields) for e in entries])
        wait_for(lambda: bool(failures), WAIT_S, "the first hand-back failing")
        settler.redis_ok()
        assert settler.flush(WAIT_S)
    finally:
        settler.close()
    assert calls == [[0, 1], [0, 1]]  # both levels in each attempt's one transaction
    assert [len(rclient.xrange(s)) for s in (QUEUE, level_stream(QUEUE, 3))] == [1, 1]


@pytest.mark.parametrize(("partitions", "prefix"), [(1, "5/"), (3, "/5/")])
def test_a_lagging_durable_enqueue_names_its_entries_levels(
    opened: Callable[..., StreamQueue], partitions: int, prefix: str
) -> None:
    q = opened("p", partitions=partitions)
    with pytest.raises(ReplicationLagError) as lag:  # no replica: WAIT answers 0
        q.enqueue_many([{"type": "start", "flow_id": "f", "execution_id": "e1"}], priority=5, wait_replicas=1,
                       wait_timeout_ms=50)  # fmt: skip
    [mid] = lag.value.ids
    assert mid.startswith(prefix) if partitions == 1 else prefix in mid, mid
