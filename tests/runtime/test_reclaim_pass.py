"""Issue 31, item 8: one reclaim pass takes every idle, unleased entry of a dead consumer, in
bounded steps, however few handler slots the worker has free; a live consumer's entries are
still taken at most as many as there are free slots. Real redis-server; the dead worker is a
test client that read entries as a consumer and never came back (what a kill -9 leaves).
"""

from __future__ import annotations

import json
import threading
import time

import pytest
import redis

from plaita.fsm import State
from plaita.runtime.suspects import silent_ms
from plaita.store.streams.queue import StreamQueue
from plaita.tasks import Task
from tests.support.workers import fast_settings, running_worker, wait_for

pytestmark = pytest.mark.redis

QUEUE = "plaita:test:queue"
GROUP = "plaita-workers"
CONSUMER = "test-host:0"  # fast_settings' consumer name
STRANDED = 100
WAIT_S = 20.0
SETTINGS = {
    "concurrency": 1,
    "prefetch": 0,
    "claim_min_idle_ms": 300,
    "lease_ttl_s": 1,
    # Only the passes the lifecycle runs at once (after the own scan, after ISOLATING): no timer.
    "reclaim_interval_s": 3600,
}


def add(client: redis.Redis, n: int) -> list[str]:
    body = json.dumps({"type": "start", "flow_id": "f", "params": {}})
    return [str(client.xadd(QUEUE, {"payload": body, "schema_version": "1"})) for _ in range(n)]


def read_as(client: redis.Redis, consumer: str, n: int) -> list[str]:
    """``n`` new entries read by ``consumer``, never acked."""
    ids = add(client, n)
    client.xreadgroup(GROUP, consumer, {QUEUE: ">"}, count=n)
    return ids


def owners(client: redis.Redis) -> dict[str, int]:
    rows = client.xpending_range(QUEUE, GROUP, "-", "+", 10_000)
    out: dict[str, int] = {}
    for r in rows:
        out[r["consumer"]] = out.get(r["consumer"], 0) + 1
    return out


def consumer_idle_ms(client: redis.Redis, name: str) -> int:
    (info,) = [c for c in client.xinfo_consumers(QUEUE, GROUP) if c["name"] == name]
    return int(info["idle"])


class Gate:
    """A handler whose first task holds until ``open`` (so the test looks between two passes)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.runs: list[tuple[str, int]] = []
        self.opened = threading.Event()

    def __call__(self, task: Task) -> None:
        with self.lock:
            self.runs.append((task.message_id, task.delivery_count))
            first = len(self.runs) == 1
        if first:
            self.opened.wait(WAIT_S)

    def ran(self) -> set[str]:
        with self.lock:
            return {m for m, _ in self.runs}


def test_one_pass_takes_all_of_a_dead_consumers_entries_with_one_free_slot(
    redis_url: str, rclient: redis.Redis
) -> None:
    """Issue 31 item 8. Before the fix a pass took at most the free slots (here 1) of them, so 100
    stranded tasks came back one pass at a time; now the first pass owns all 100 while the
    first of them still runs, and they run alone, uncharged, as crash suspects."""
    rclient.xgroup_create(QUEUE, GROUP, id="0", mkstream=True)
    ids = read_as(rclient, "dead-host:0", STRANDED)
    silent = silent_ms(fast_settings(redis_url, **SETTINGS))
    wait_for(lambda: consumer_idle_ms(rclient, "dead-host:0") > silent + 200, WAIT_S, "the dead consumer silent")
    gate = Gate()
    with running_worker(redis_url, recorder=gate, wait_reading=False, **SETTINGS) as w:  # type: ignore[arg-type]
        wait_for(lambda: len(gate.ran()) == 1, WAIT_S, "the first reclaimed task runs")
        assert w.worker.entered(State.RECLAIMING) == 1, "one pass so far"
        assert owners(rclient) == {CONSUMER: STRANDED}, "the one pass took every stranded entry"
        gate.opened.set()
        wait_for(lambda: gate.ran() == set(ids), WAIT_S, "every stranded task ran")
        assert w.worker.counters.reclaimed == STRANDED
    assert sorted(gate.runs) == sorted((m, 1) for m in ids), "suspects are not charged a delivery"


def test_a_live_consumers_entries_are_still_bounded_by_the_budget(redis_url: str, rclient: redis.Redis) -> None:
    """Issue 31 item 8: only a dead consumer's entries are exempt from the budget: a live
    consumer's idle entries (failed tasks awaiting redelivery) run in handler slots, so a step
    with a budget of 2 takes 2 of them, and all of the dead one's."""
    rclient.xgroup_create(QUEUE, GROUP, id="0", mkstream=True)
    dead = read_as(rclient, "dead-host:0", 5)
    live = read_as(rclient, "live-host:0", 5)
    dead_ms = 300
    wait_for(lambda: consumer_idle_ms(rclient, "dead-host:0") > dead_ms + 100, WAIT_S, "the dead consumer silent")
    live += read_as(rclient, "live-host:0", 1)  # the live one still reads (a delivery resets its idle)
    raw = redis.Redis.from_url(redis_url, socket_timeout=5)  # StreamQueue reads bytes
    q = StreamQueue(raw, stream=QUEUE, group=GROUP, consumer=CONSUMER, dlq_key=f"{QUEUE}:dlq", dlq_max_len=100)
    started = time.monotonic()
    cursor, claimed, skipped = q.claim_unleased("0-0", 0, 2, dead_ms=dead_ms)
    assert time.monotonic() - started < dead_ms / 1000, "the live consumer stayed live during the claim"
    assert {e.message_id for e in claimed} == set(dead) | set(live[:2])
    assert skipped == 0 and cursor == live[1], "the next step starts after the last live entry taken"
    cursor, claimed, _ = q.claim_unleased(cursor, 0, 10, dead_ms=dead_ms)
    assert ({e.message_id for e in claimed}, cursor) == (set(live[2:]), "0-0")
    raw.close()


def test_a_dead_consumers_entries_are_claimed_with_no_slot_free(redis_url: str, rclient: redis.Redis) -> None:
    """Issue 31 item 8: the worker's one slot runs a long task, yet a reclaim pass takes all of a
    dead consumer's entries (they wait as suspects, needing no slot). Before the fix a pass with
    no free slot claimed nothing, so a busy survivor took a dead worker's tasks a few at a time."""
    rclient.xgroup_create(QUEUE, GROUP, id="0", mkstream=True)
    gate = Gate()
    settings = {**SETTINGS, "reclaim_interval_s": 0.2}
    with running_worker(redis_url, recorder=gate, **settings) as w:  # type: ignore[arg-type]
        busy = add(rclient, 1)
        wait_for(lambda: gate.ran() == set(busy), WAIT_S, "the busy task holds the only slot")
        ids = read_as(rclient, "dead-host:0", STRANDED)
        silent = silent_ms(fast_settings(redis_url, **settings))
        wait_for(lambda: consumer_idle_ms(rclient, "dead-host:0") > silent + 200, WAIT_S, "the dead consumer silent")
        wait_for(lambda: owners(rclient).get(CONSUMER, 0) == 1 + STRANDED, WAIT_S, "every stranded entry claimed")
        assert gate.ran() == set(busy), "claimed while the slot was still busy"
        gate.opened.set()
        wait_for(lambda: gate.ran() == set(busy) | set(ids), WAIT_S, "every stranded task ran")
        assert w.worker.counters.reclaimed == STRANDED
