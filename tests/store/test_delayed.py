"""Delayed tasks on a real server: due in order, moved exactly once however many movers race,
nothing moved early, a key of the wrong type refused whole, and the delay's bounds."""

from __future__ import annotations

import json
import threading
import time

import pytest
import redis

from plaita.config import Settings
from plaita.store.streams.delayed import (
    MAX_DELAY_S,
    add_tasks,
    delayed_count,
    delayed_key,
    due_ms_of,
    make_due_now,
    move_due,
)
from plaita.store.streams.partitioned import open_queue
from plaita.store.streams.queue import StreamQueue

pytestmark = pytest.mark.redis

QUEUE = "plaita:test:delayed"


def _queue(url: str, partitions: int = 1) -> StreamQueue:
    settings = Settings(redis_url=url, queue_name=QUEUE, consumer_name="t", partitions=partitions)
    return open_queue(settings, client=redis.Redis.from_url(url, socket_timeout=5))


def _payloads(client: redis.Redis, stream: str) -> list[dict[str, object]]:
    return [json.loads(fields[b"payload"]) for _, fields in client.xrange(stream)]


def test_tasks_move_when_due_in_due_order_and_not_before(redis_url: str, bclient: redis.Redis) -> None:
    q = _queue(redis_url)
    now_s = time.time()
    # Added latest-due first: the stream must still get them in due order.
    for n in (3, 2, 1):
        add_tasks(q, [{"type": "start", "flow_id": "f", "params": {"n": n}}], at_s=now_s + 100 * n)
    assert bclient.xlen(QUEUE) == 0 and delayed_count(bclient, [QUEUE]) == 3
    assert q.move_due(int((now_s + 50) * 1000)) == 0  # nothing due yet
    assert q.move_due(int((now_s + 250) * 1000)) == 2
    assert [p["params"] for p in _payloads(bclient, QUEUE)] == [{"n": 1}, {"n": 2}]
    assert q.move_due(int((now_s + 400) * 1000)) == 1
    assert [p["params"] for p in _payloads(bclient, QUEUE)] == [{"n": 1}, {"n": 2}, {"n": 3}]
    assert delayed_count(bclient, [QUEUE]) == 0
    assert bclient.xrange(QUEUE)[0][1][b"schema_version"] == b"1"


def test_two_movers_racing_add_every_task_exactly_once(redis_url: str, bclient: redis.Redis) -> None:
    q = _queue(redis_url)
    n = 600
    ids = add_tasks(q, [{"type": "start", "flow_id": "f", "params": {"n": i}} for i in range(n)], delay_s=1)
    assert len(set(ids)) == n and all(i.startswith("d-") for i in ids)
    due_ms = int((time.time() + 2) * 1000)
    moved: list[int] = []
    barrier = threading.Barrier(2)

    def mover() -> None:
        client = redis.Redis.from_url(redis_url, socket_timeout=5)
        barrier.wait(10)
        total = 0
        for _ in range(n):  # bounded: each call moves at least one while any is left
            step = move_due(client, QUEUE, due_ms, limit=7)
            if step == 0 and client.zcard(delayed_key(QUEUE)) == 0:
                break
            total += step
        moved.append(total)
        client.close()

    threads = [threading.Thread(target=mover) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sum(moved) == n, moved  # together, every task once
    assert sorted(p["params"]["n"] for p in _payloads(bclient, QUEUE)) == list(range(n))  # type: ignore[index]


def test_a_partitioned_queue_delays_each_task_on_its_own_partition(redis_url: str, bclient: redis.Redis) -> None:
    q = _queue(redis_url, partitions=3)
    bodies = [{"type": "start", "flow_id": "f", "execution_id": f"e{i}"} for i in range(30)]
    add_tasks(q, bodies, delay_s=5)
    streams = q.streams
    assert delayed_count(bclient, streams) == 30
    assert q.move_due(int((time.time() + 10) * 1000)) == 30
    for p, stream in enumerate(streams):
        for payload in _payloads(bclient, stream):
            assert q.keyspace.partition_of(str(payload["execution_id"])) == p


def test_a_key_of_the_wrong_type_moves_nothing(redis_url: str, bclient: redis.Redis) -> None:
    q = _queue(redis_url)
    add_tasks(q, [{"type": "start", "flow_id": "f"}], delay_s=1)
    bclient.set(QUEUE, "not a stream")
    assert q.move_due(int((time.time() + 5) * 1000)) == 0
    assert delayed_count(bclient, [QUEUE]) == 1  # kept for when the stream is mended


def test_a_zero_delay_is_added_now() -> None:
    assert due_ms_of(None, None, 100.0) == 0
    assert due_ms_of(0, None, 100.0) == 0
    assert due_ms_of(None, 50.0, 100.0) == 0  # an `at` already past: due now
    assert due_ms_of(1.5, None, 100.0) == 101_500
    assert due_ms_of(None, 200.25, 100.0) == 200_250


@pytest.mark.parametrize(
    ("delay_s", "at_s", "message"),
    [
        (1.0, 200.0, "not both"),
        (-1.0, None, "within"),
        (float("nan"), None, "within"),
        (MAX_DELAY_S + 1, None, "within"),
        (True, None, "number"),
        (None, float("inf"), "10 years"),
    ],
)
def test_a_bad_delay_is_refused(delay_s: float | None, at_s: float | None, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        due_ms_of(delay_s, at_s, 100.0)


def test_one_member_made_due_now_moves_alone_and_once(redis_url: str, bclient: redis.Redis) -> None:
    q = _queue(redis_url)
    at_s = time.time() + 3600
    first, second = add_tasks(q, [{"type": "start", "flow_id": "f", "params": {"n": n}} for n in (1, 2)], at_s=at_s)
    due_ms = due_ms_of(None, at_s, time.time())
    assert make_due_now(bclient, QUEUE, due_ms + 1, second) is False  # not at that due time
    assert make_due_now(bclient, QUEUE, due_ms, first) is True
    assert q.move_due(int(time.time() * 1000)) == 1
    assert [p["params"] for p in _payloads(bclient, QUEUE)] == [{"n": 1}]
    assert make_due_now(bclient, QUEUE, due_ms, first) is False  # moved already: not added back
    assert q.move_due(int(time.time() * 1000)) == 0
    assert bclient.xlen(QUEUE) == 1 and delayed_count(bclient, [QUEUE]) == 1
