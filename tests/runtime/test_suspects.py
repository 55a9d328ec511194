"""ISOLATING, in process on a real redis-server: who is a suspect, how suspects run, and what a
graceful stop or a Redis outage does to them (``plaita.runtime.suspects``).

A dead predecessor is played by a test client reading entries as a consumer that never comes
back (its pending entries are then exactly what a killed worker leaves).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import redis

from plaita.fsm import State
from plaita.runtime.suspects import silent_ms
from plaita.tasks import Task
from tests.support.redis_server import RedisServer
from tests.support.workers import fast_settings, running_worker, wait_for

pytestmark = pytest.mark.redis

QUEUE = "plaita:test:queue"
GROUP = "plaita-workers"
CONSUMER = "test-host:0"  # fast_settings' consumer name


class Probe:
    """A handler that records each run (message id, delivery count) and the most tasks that ran
    at once; a task whose params say ``fail`` raises, ``hold_s`` holds that long."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.runs: list[tuple[str, int]] = []
        self.running = 0
        self.most = 0

    def __call__(self, task: Task) -> None:
        with self.lock:
            self.runs.append((task.message_id, task.delivery_count))
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            params = task.body.get("params") or {}
            task.cancelled.wait(float(params.get("hold_s", 0.05)))
            if params.get("fail"):
                raise RuntimeError("planned failure")
        finally:
            with self.lock:
                self.running -= 1

    def ran(self) -> set[str]:
        with self.lock:
            return {m for m, _ in self.runs}


def add(client: redis.Redis, n: int, **params: object) -> list[str]:
    body = {"type": "start", "flow_id": "f", "params": params}
    return [str(client.xadd(QUEUE, {"payload": json.dumps(body), "schema_version": "1"})) for _ in range(n)]


def died_holding(client: redis.Redis, n: int, consumer: str = CONSUMER, **params: object) -> list[str]:
    """``n`` entries read by ``consumer``, which then never acks them: a killed worker's."""
    client.xgroup_create(QUEUE, GROUP, id="0", mkstream=True)
    ids = add(client, n, **params)
    client.xreadgroup(GROUP, consumer, {QUEUE: ">"}, count=n)
    return ids


@contextmanager
def worker(url: str, probe: Probe, **overrides: object) -> Iterator[object]:
    with running_worker(url, recorder=probe, wait_reading=False, **overrides) as w:  # type: ignore[arg-type]
        yield w


def crash_keys(client: redis.Redis) -> list[str]:
    return [str(k) for k in client.keys("plaita:execution:crashes:*")]


def test_own_entries_left_by_a_dead_predecessor_run_one_at_a_time_uncharged(
    redis_url: str, rclient: redis.Redis
) -> None:
    ids = died_holding(rclient, 4)
    probe = Probe()
    with worker(redis_url, probe, concurrency=4) as w:
        wait_for(lambda: probe.ran() == set(ids) and rclient.xlen(QUEUE) == 0, 10.0, "every suspect done")
        wait_for(lambda: w.worker.lifecycle.state is State.READING, 10.0, "READING")  # type: ignore[attr-defined]
        assert w.worker.entered(State.ISOLATING) >= 1  # type: ignore[attr-defined]
        assert crash_keys(rclient) == [], "each ran alone and lived: no strike is left"
    assert probe.most == 1, "suspects run alone"
    assert sorted(probe.runs) == sorted((m, 1) for m in ids), "the crash's re-read is no delivery"


def test_a_dead_consumers_entries_are_suspects_a_live_ones_failures_are_not(
    redis_url: str, rclient: redis.Redis
) -> None:
    """Claimed from a consumer silent for ``silent_ms``: suspects (uncharged, alone). The worker's
    own failed task, claimed back for its redelivery, is charged as before (delivery 2)."""
    dead = died_holding(rclient, 3, consumer="dead-host:0")
    failing = add(rclient, 1, fail=True)
    probe = Probe()
    settings = {"concurrency": 4, "claim_min_idle_ms": 300, "reclaim_interval_s": 0.1, "lease_ttl_s": 1}
    silent = silent_ms(fast_settings(redis_url, **settings))  # type: ignore[arg-type]

    def dead_for_long() -> bool:
        (info,) = [c for c in rclient.xinfo_consumers(QUEUE, GROUP) if c["name"] == "dead-host:0"]
        return int(info["idle"]) > silent + 200

    wait_for(dead_for_long, 10.0, "the dead consumer silent long enough")
    with worker(redis_url, probe, **settings) as w:
        wait_for(lambda: set(dead) <= probe.ran(), 15.0, "the dead consumer's tasks run")
        wait_for(lambda: (failing[0], 2) in probe.runs, 10.0, "the failed task redelivered")
        assert w.worker.entered(State.ISOLATING) >= 1  # type: ignore[attr-defined]
    assert [d for m, d in probe.runs if m in dead] == [1, 1, 1]


def test_a_graceful_stop_leaves_no_suspects(redis_url: str, rclient: redis.Redis) -> None:
    """A worker that stopped gracefully leaves a failed task pending (awaiting redelivery) and
    hands a running one back: its successor runs them as usual, no ISOLATING, no strike."""
    probe = Probe()
    with worker(redis_url, probe, concurrency=2, drain_timeout_s=0.2) as w:
        failing = add(rclient, 1, fail=True)
        held = add(rclient, 1, hold_s=30)
        wait_for(lambda: {failing[0], held[0]} <= probe.ran(), 10.0, "both started")
        wait_for(lambda: w.worker.counters.failed == 1, 10.0, "the failure settled")  # type: ignore[attr-defined]
    assert rclient.xpending(QUEUE, GROUP)["pending"] == 1  # the failed one; the held one went back
    second = Probe()
    with worker(redis_url, second, concurrency=2, claim_min_idle_ms=200, reclaim_interval_s=0.1) as w2:
        wait_for(lambda: failing[0] in second.ran() and len(second.runs) >= 2, 10.0, "both run again")
        assert w2.worker.entered(State.ISOLATING) == 0  # type: ignore[attr-defined]
    assert (failing[0], 2) in second.runs, "a failed task's redelivery is charged as before"
    assert crash_keys(rclient) == []


def test_a_redis_outage_while_isolating_is_backoff_then_the_suspects_finish(private_redis: RedisServer) -> None:
    client = private_redis.client(decode_responses=True)
    ids = died_holding(client, 3, hold_s=0.6)
    probe = Probe()
    with worker(private_redis.url, probe, concurrency=4) as w:
        wait_for(lambda: len(probe.runs) >= 1, 10.0, "the first suspect runs")
        private_redis.freeze()
        try:
            wait_for(lambda: w.worker.entered(State.BACKOFF) >= 1, 10.0, "BACKOFF")  # type: ignore[attr-defined]
        finally:
            private_redis.thaw()
        wait_for(lambda: probe.ran() == set(ids) and client.xlen(QUEUE) == 0, 20.0, "every suspect done")
        wait_for(lambda: w.worker.lifecycle.state is State.READING, 10.0, "READING")  # type: ignore[attr-defined]
        assert w.alive  # type: ignore[attr-defined]
    assert probe.most == 1
    assert all(d == 1 for _, d in probe.runs), probe.runs
    client.close()


def test_a_lone_suspect_is_blamed_at_once(redis_url: str, rclient: redis.Redis) -> None:
    """The predecessor had one entry pending when it died: the only candidate, so that crash is a
    strike against it at once. With ``--max-crashes 1`` it is dead-lettered without running."""
    (mid,) = died_holding(rclient, 1)
    probe = Probe()
    with worker(redis_url, probe, concurrency=4, max_crashes=1) as w:
        wait_for(lambda: rclient.xlen(f"{QUEUE}:dlq") == 1, 10.0, "the lone suspect dead-lettered")
        wait_for(lambda: w.worker.lifecycle.state is State.READING, 10.0, "READING")  # type: ignore[attr-defined]
    assert probe.runs == [], "a task found guilty does not run again"
    ((_, fields),) = rclient.xrange(f"{QUEUE}:dlq")
    envelope = json.loads(fields["payload"])
    assert (envelope["source_id"], envelope["delivery_count"]) == (mid, 1)
    assert envelope["reason"].startswith("killed its worker process 1 times")
    assert rclient.xlen(QUEUE) == 0


def test_a_lone_suspect_that_lives_keeps_no_strike(redis_url: str, rclient: redis.Redis) -> None:
    """Blamed at once (one strike of three), it runs alone, lives, and its record is deleted."""
    (mid,) = died_holding(rclient, 1)
    probe = Probe()
    with worker(redis_url, probe, concurrency=4, max_crashes=3):
        wait_for(lambda: probe.ran() == {mid} and rclient.xlen(QUEUE) == 0, 10.0, "the suspect done")
        wait_for(lambda: crash_keys(rclient) == [], 10.0, "its record deleted")
    assert probe.runs == [(mid, 1)]


def test_two_suspects_are_not_blamed_for_a_crash_they_shared(redis_url: str, rclient: redis.Redis) -> None:
    """Two entries pending at the crash: either may be innocent, so neither is charged at once,
    even with ``--max-crashes 1``; each runs alone and lives."""
    ids = died_holding(rclient, 2)
    probe = Probe()
    with worker(redis_url, probe, concurrency=4, max_crashes=1):
        wait_for(lambda: probe.ran() == set(ids) and rclient.xlen(QUEUE) == 0, 10.0, "both done")
        wait_for(lambda: crash_keys(rclient) == [], 10.0, "no record left")
    assert rclient.xlen(f"{QUEUE}:dlq") == 0
    assert sorted(probe.runs) == sorted((m, 1) for m in ids)
    assert probe.most == 1
