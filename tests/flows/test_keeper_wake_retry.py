"""A wake or timeout whose enqueue failed is sent again at once, not after the cooldown.

The keeper holds a due deadline (for one keeper lease) as it claims it, before the enqueue, and
re-arms it for ``--timeout-cooldown-s`` (60 s) once the wake is sent. Found by the soak: a Redis
freeze between the claim and the enqueue left a durable sleep 62 s late. Now a failed enqueue
takes the hold back (and when Redis fails that too, the next pass does), so the next pass, or
the 0.25 s deadline peek, sends it again; a keeper killed between the two leaves it to its
successor a lease later. Real Redis; the fault is a real client refusing one command, as a cut
connection would, or dying in it, as a kill -9 would.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from plaita.config import Settings
from plaita.flows.keeper.keeper import Keeper, KeeperSettings
from plaita.ops.keeper_build import build_keeper
from plaita.store.client import make_client
from plaita.store.executions.keeper_store import UNCLAIM_DEADLINES
from plaita.store.executions.store import ExecutionStore
from plaita.store.streams.partitioned import keyspace_of
from plaita.store.streams.queue import StreamQueue
from tests.flows.support import Harness, start
from tests.support.lease_workers import QUEUE
from tests.support.workers import wait_for

pytestmark = pytest.mark.redis

#: The default cooldown: every re-send asserted here comes well before it.
SETTINGS = KeeperSettings(interval_s=0.1, orphan_grace_s=0.0, lease_ttl_s=2.0, timeout_cooldown_s=60.0)
DEADLINES = "plaita:executions:deadlines"


class Faulty(redis.Redis):
    """A real client that refuses the next ``xadd_failures`` XADDs and ``unclaim_failures``
    take-backs (the EVALSHA of ``unclaim_deadlines``) with a ConnectionError."""

    xadd_failures = 0
    unclaim_failures = 0

    def execute_command(self, *args: Any, **options: Any) -> Any:
        if args[0] == "XADD" and self.xadd_failures > 0:
            self.xadd_failures -= 1
            raise redis.ConnectionError("test: connection cut during XADD")
        if args[0] == "EVALSHA" and args[1] == UNCLAIM_DEADLINES.sha and self.unclaim_failures > 0:
            self.unclaim_failures -= 1
            raise redis.ConnectionError("test: connection cut during the take-back")
        return super().execute_command(*args, **options)


@pytest.fixture
def faulty(redis_url: str) -> Iterator[Faulty]:
    client = Faulty.from_url(redis_url, socket_timeout=5.0)
    yield client
    client.close()


def keeper_on(client: Faulty, settings: KeeperSettings = SETTINGS) -> Keeper:
    queue = StreamQueue(client, stream=QUEUE, group="plaita-workers", consumer="k", dlq_key="d", dlq_max_len=1)
    return build_keeper(ExecutionStore(client), queue, settings)


def queued(client: redis.Redis) -> list[dict[str, Any]]:
    return [json.loads(f[b"payload"]) for _, f in client.xrange(QUEUE)]  # type: ignore[union-attr]


def test_a_failed_enqueue_is_sent_again_by_the_next_pass(h: Harness, faulty: Faulty) -> None:
    h.run(start("lost", "signup", timeout_s=0))
    k = keeper_on(faulty)
    faulty.xadd_failures = 1
    with pytest.raises(redis.ConnectionError):
        k.run_once()
    assert queued(h.client) == []
    score = h.client.zscore(DEADLINES, "lost")
    assert score is not None and score <= time.time()  # due again, not re-armed a minute ahead
    assert k.run_once().timeouts == ["lost"]  # no clock moved: the very next pass sends it
    [task] = queued(h.client)
    doc = h.run(task)
    assert doc is not None and doc["state"]["resumed_by"] == "timeout"


def test_the_rest_of_a_failed_batch_is_taken_back_too(h: Harness, faulty: Faulty) -> None:
    for eid in ("b1", "b2", "b3"):
        h.run(start(eid, "signup", timeout_s=0))
    k = keeper_on(faulty)
    faulty.xadd_failures = 1  # the first enqueue fails: the two after it were never tried
    with pytest.raises(redis.ConnectionError):
        k.run_once()
    assert all((s := h.client.zscore(DEADLINES, e)) is not None and s <= time.time() for e in ("b1", "b2", "b3"))
    assert sorted(k.run_once().timeouts) == ["b1", "b2", "b3"]
    assert len(queued(h.client)) == 3


def test_a_take_back_that_fails_too_is_done_by_the_next_pass(h: Harness, faulty: Faulty) -> None:
    h.run(start("lost", "signup", timeout_s=0))
    k = keeper_on(faulty)
    faulty.xadd_failures, faulty.unclaim_failures = 1, 1  # Redis fails the take-back as well
    with pytest.raises(redis.ConnectionError):
        k.run_once()
    score = h.client.zscore(DEADLINES, "lost")
    assert score is not None and score > time.time()  # still held by the claim: remembered instead
    assert k.run_once().timeouts == ["lost"]
    assert len(queued(h.client)) == 1
    assert k.run_once().timeouts == []  # sent once: re-armed for the cooldown again


class Killed(BaseException):
    """The keeper's process dies here: no handler of the keeper runs after it (kill -9)."""


class Dying(redis.Redis):
    """A real client whose keeper is killed as it sends its first XADD."""

    def execute_command(self, *args: Any, **options: Any) -> Any:
        if args[0] == "XADD":
            raise Killed
        return super().execute_command(*args, **options)


def test_a_keeper_killed_between_claim_and_enqueue_leaves_the_wake_to_its_successor(
    h: Harness, redis_url: str, faulty: Faulty
) -> None:
    """The claim holds the deadline for one keeper lease (2 s here), not the 60 s cooldown: the
    keeper that takes over once the dead one's lease expired sends the wake."""
    h.run(start("lost", "signup", timeout_s=0))
    dying, claimed_after_s = Dying.from_url(redis_url, socket_timeout=5.0), time.time()
    try:
        with pytest.raises(Killed):
            keeper_on(dying).run_once()  # type: ignore[arg-type]
    finally:
        dying.close()
    assert queued(h.client) == []
    score = h.client.zscore(DEADLINES, "lost")
    assert score is not None and claimed_after_s < score <= time.time() + SETTINGS.lease_ttl_s  # held, not 60 s
    successor, sent = keeper_on(faulty), []

    def successor_sent() -> bool:  # it acts once the dead keeper's lease expired (2 s)
        sent.extend(successor.run_once().timeouts)
        return bool(sent)

    wait_for(successor_sent, 10.0, "the successor's wake")  # the cooldown is 60 s
    assert sent == ["lost"]
    [task] = queued(h.client)
    doc = h.run(task)
    assert doc is not None and doc["state"]["resumed_by"] == "timeout"


def test_a_sent_wake_is_re_armed_for_the_cooldown_not_the_hold(h: Harness, faulty: Faulty) -> None:
    """After the enqueue the deadline waits the whole cooldown: a keeper a lease later sends
    nothing again, one past the cooldown does (the wake was not acted on)."""
    h.run(start("slow", "signup", timeout_s=0))
    k = keeper_on(faulty)
    assert k.run_once().timeouts == ["slow"]
    score = h.client.zscore(DEADLINES, "slow")
    assert score is not None and score > time.time() + SETTINGS.timeout_cooldown_s - 5
    k._clock = lambda: time.time() + SETTINGS.lease_ttl_s + 1
    assert k.run_once().timeouts == []
    k._clock = lambda: time.time() + SETTINGS.timeout_cooldown_s + 1
    assert k.run_once().timeouts == ["slow"]
    assert len(queued(h.client)) == 2


def test_a_running_keeper_re_sends_a_failed_wake_promptly(h: Harness, faulty: Faulty) -> None:
    """The loop: full passes 30 s apart, so only the deadline peek (or the failure's backoff)
    can send it again; it must come long before the 60 s cooldown."""
    k = keeper_on(faulty, KeeperSettings(interval_s=30.0, orphan_grace_s=0.0, lease_ttl_s=60.0))
    thread = threading.Thread(target=k.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: faulty.exists("plaita:keeper:lease") == 1, 10.0, "the keeper's first pass")
        faulty.xadd_failures, faulty.unclaim_failures = 1, 1
        h.run(start("lost", "signup", timeout_s=0))
        wait_for(lambda: len(queued(h.client)) == 1, 20.0, "the timeout sent again")
        assert faulty.xadd_failures == 0 and faulty.unclaim_failures == 0  # both faults were hit
    finally:
        k.request_stop()
        thread.join(10.0)
    assert not thread.is_alive()
    [task] = queued(h.client)
    doc = h.run(task)
    assert doc is not None and doc["state"]["resumed_by"] == "timeout"


def test_the_take_back_covers_every_partition_and_spares_a_newer_deadline(redis_url: str) -> None:
    """``unclaim_deadlines`` on a 3-partition keyspace: each claimed member is due again in its
    own partition's index; one whose deadline changed since the claim (a newer suspension) keeps it."""
    settings = Settings(redis_url=redis_url, queue_name=QUEUE, partitions=3)
    client = make_client(redis_url, socket_timeout_s=5.0)
    try:
        ks = keyspace_of(settings)
        store = ExecutionStore(client, ks)
        ids = {ks.partition_of(f"d-{i}"): f"d-{i}" for i in range(40)}
        assert sorted(ids) == [0, 1, 2]
        now_s = time.time()
        for p, eid in ids.items():
            client.zadd(ks.deadlines_key(p), {eid: now_s - 1})
        rearm_at_s = now_s + 60
        assert sorted(store.due_deadlines(now_s, rearm_at_s, 10, dry_run=False)) == sorted(ids.values())
        newer = ids[1]
        client.zadd(ks.deadlines_key(1), {newer: now_s + 3600})  # re-suspended meanwhile
        assert store.unclaim_deadlines(list(ids.values()), rearm_at_s, now_s) == 2
        assert client.zscore(ks.deadlines_key(1), newer) == now_s + 3600
        assert sorted(store.due_deadlines(now_s, rearm_at_s, 10, dry_run=True)) == sorted({ids[0], ids[2]})
    finally:
        client.close()
