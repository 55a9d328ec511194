"""Schedules end to end: a worker process and three keeper processes on a once-a-second schedule
(the acting keeper killed -9 again and again), ``plaita schedules list``, and a bad schedule refused with exit 2."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import pytest
import redis

from plaita.store.executions.keeper_store import keeper_lease_key
from plaita.store.keyspace import DEFAULT
from tests.support.lease_workers import QUEUE, ROOT, keeper_proc, wait_for, worker_env, worker_proc

pytestmark = pytest.mark.redis

FLOWS = "tests.flows.scheduled"
LEASE = keeper_lease_key(QUEUE)  # the test queue's keeper lease


def plaita(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "plaita", *args]
    return subprocess.run(cmd, cwd=str(ROOT), env=worker_env(url), capture_output=True, text=True, timeout=60)


def ticks_run(client: redis.Redis) -> dict[int, int]:
    keys = [k.decode() for k in client.scan_iter("plaita:test:tick:*", count=1000)]
    return {int(k.rsplit(":", 1)[1]): int(client.get(k) or 0) for k in keys}


#: Seconds the keepers race after the first ticks run; the acting keeper is killed -9 (and a
#: new one started) every KILL_EVERY_S. PLAITA_SCHEDULE_SOAK_S=180 runs the issue's 3 minutes.
SOAK_S = float(os.environ.get("PLAITA_SCHEDULE_SOAK_S", "4"))
KILL_EVERY_S = 3.0


def kill_acting(client: redis.Redis, keepers: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    holder = wait_for_holder(client)
    acting = next(k for k in keepers if k.poll() is None and f":{k.pid}:" in holder)
    os.kill(acting.pid, signal.SIGKILL)
    acting.wait(5)
    return acting


def wait_for_holder(client: redis.Redis) -> str:
    wait_for(lambda: client.get(LEASE) is not None, 10, "a keeper holding the lease")
    return (client.get(LEASE) or b"").decode()


@pytest.mark.timeout(SOAK_S + 90)
def test_keepers_racing_and_killed_start_every_tick_exactly_once(redis_url: str, tmp_path: Path) -> None:
    client = redis.Redis.from_url(redis_url, socket_timeout=5)
    keeper_args = ("--flows", FLOWS, "--interval-s", "0.2", "--keeper-lease-ttl-s", "1")
    began_s = time.time()
    with ExitStack() as stack:
        stack.enter_context(worker_proc(redis_url, tmp_path, "sw", "--flows", FLOWS, "--concurrency", "8"))
        keepers = [stack.enter_context(keeper_proc(redis_url, tmp_path, f"k{i}", *keeper_args)) for i in range(3)]
        wait_for(lambda: len(ticks_run(client)) >= 3, 30, "three ticks run")
        # Kill the acting keeper, again and again: another takes the lease after its TTL (a keeper
        # killed between claim and enqueue leaves pending ticks, enqueued again 10 s later); the
        # ticks meanwhile are within grace_s, so they still start, once each.
        deadline_s, kills = time.monotonic() + SOAK_S, 0
        while kills == 0 or time.monotonic() < deadline_s:
            keepers.remove(kill_acting(client, keepers))
            kills += 1
            keepers.append(stack.enter_context(keeper_proc(redis_url, tmp_path, f"k{kills + 2}", *keeper_args)))
            time.sleep(min(KILL_EVERY_S, max(0.0, deadline_s - time.monotonic())))  # pacing, not synchronisation
        ahead_s = time.time() + 2
        wait_for(lambda: max(ticks_run(client)) >= ahead_s, 30, "ticks after the last kill")
        for k in keepers:  # no new ticks from here on
            k.send_signal(signal.SIGTERM)
        for k in keepers:
            k.wait(10)
        first = min(ticks_run(client))
        last = int(client.hget("plaita:schedule:every-second", "last_tick_s") or 0)
        # Every tick claimed runs, out of order at the end (8 at once): wait for the stragglers.
        wait_for(lambda: set(ticks_run(client)) >= set(range(first, last + 1)), 30, "every claimed tick run")
        listed = plaita(redis_url, "schedules", "list", "--json", "--redis-url", redis_url, "--queue-name", QUEUE)
    ran = ticks_run(client)
    assert sorted(ran) == list(range(first, last + 1)), f"a tick was started that was never claimed: {sorted(ran)}"
    assert set(ran.values()) == {1}, f"a tick ran twice: {ran}"
    assert last - first >= SOAK_S
    # The first pass starts the ticks of the minute before (within grace_s): not counted here.
    late_s = sorted(lateness(client, t) for t in ran if t > began_s + 2)
    p50_s, max_s = late_s[len(late_s) // 2], late_s[-1]
    print(f"{len(ran)} ticks, {kills} acting keepers killed; start lateness p50 {p50_s:.3f} s, max {max_s:.3f} s")
    eid = f"schedule:every-second:{last}"
    doc = json.loads(client.get(DEFAULT.execution_key(eid)) or "null")
    assert doc["status"] == "completed" and doc["params"]["source"] == "test"
    assert listed.returncode == 0, listed.stderr
    [row] = json.loads(listed.stdout)
    assert row["flow"] == "every-second" and row["cron"] == "* * * * * *" and row["tz"] == "UTC"
    assert row["missed"] == "all" and row["last_execution_id"].startswith("schedule:every-second:")
    assert row["last_execution_id"] == eid and row["last_status"] == "completed" and row["next_tick_s"] > last
    client.close()


def lateness(client: redis.Redis, tick_s: int) -> float:
    doc = json.loads(client.get(DEFAULT.execution_key(f"schedule:every-second:{tick_s}")) or "null")
    return float(doc["created_at"]) - tick_s


def test_schedules_list_without_any_and_with_the_module(redis_url: str) -> None:
    empty = plaita(redis_url, "schedules", "list", "--redis-url", redis_url)
    assert empty.returncode == 0 and "(no schedules)" in empty.stdout
    listed = plaita(redis_url, "schedules", "list", "--flows", FLOWS, "--redis-url", redis_url)
    assert listed.returncode == 0, listed.stderr
    [header, row] = listed.stdout.splitlines()
    assert header.startswith("FLOW") and row.split()[:7] == ["every-second", "*", "*", "*", "*", "*", "*"]
    assert row.rstrip().endswith("-")  # never run yet: no last execution


@pytest.mark.parametrize("command", [("keeper", "--once"), ("schedules", "list"), ("worker",)])
def test_a_bad_schedule_exits_2_with_one_line(redis_url: str, command: tuple[str, ...]) -> None:
    done = plaita(redis_url, *command, "--flows", "tests.flows.schedule_bad", "--redis-url", redis_url)
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert "unknown time zone 'Europe/Atlantis'" in line and "Traceback" not in done.stderr
