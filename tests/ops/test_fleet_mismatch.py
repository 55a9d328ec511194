"""Issue 18, reproductions 8 and 10: fleet misconfigurations are reported, not silent.

A producer with ``--partitions 4`` and a worker with 2 left 10 of 12 tasks in streams nobody
reads, and nothing said so (``status --partitions 2`` showed an empty queue). Workers now publish
their partition count and what they run; a worker logs each problem at error level (once per
check, every minute), is not ready (/readyz says why), and ``status`` / ``workers`` print it.
Real ``plaita worker`` subprocesses on a private redis-server.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from tests.support.ops import QUEUE, ROOT, clean_env, holds_for, ops_worker, plaita, wait_until

pytestmark = pytest.mark.redis


def not_ready_because(w: object, needle: str) -> bool:
    r = w.readyz()  # type: ignore[attr-defined]
    return r is not None and r[0] == 503 and needle in r[1]


def error_lines(stderr: str, needle: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if " ERROR " in ln and needle in ln]


def test_producer_with_more_partitions_than_the_worker_is_reported(redis_url: str, tmp_path: Path) -> None:
    """Reproduction 8: producer 4 partitions, worker 2."""
    bodies = "\n".join(json.dumps({"type": "start", "flow_id": "f", "params": {"n": i}}) for i in range(12))
    produced = subprocess.run(
        [sys.executable, "-m", "plaita", "enqueue", "--redis-url", redis_url, "--queue-name", QUEUE,
         "--partitions", "4"],
        input=bodies, cwd=str(ROOT), env=clean_env(), capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert produced.returncode == 0, produced.stderr
    with ops_worker(redis_url, tmp_path, "--partitions", "2", name="p2", wait_ready=False) as w:
        wait_until(lambda: not_ready_because(w, "partition"), 15, "/readyz not ready because of the partitions")
        _code, body = w.readyz() or (0, "")
        assert "task(s) wait in stream(s) no worker with --partitions 2 reads" in body, body
        status = w.status() or {}
        assert status.get("ready") is False and "partition mismatch" in str(status.get("ready_reason"))
        wait_until(lambda: len(w.done_ids()) >= 1, 10, "the worker consumed its own partitions' tasks")
        consumed = len(w.done_ids())
        stranded = 12 - consumed
        lines = error_lines(w.stderr(), "partition mismatch")
        assert len(lines) == 1 and f"{stranded} task(s)" in lines[0], w.stderr()
        # Once a minute, not once per monitor tick (1 s): still one line a few ticks later.
        holds_for(lambda: len(error_lines(w.stderr(), "partition mismatch")) == 1, 3.0, "one error line")
        st = plaita(redis_url, "status")  # no --partitions: the fleet's
        assert st.returncode == 0, st.stderr
        assert "partitions: 2 (the registered workers')" in st.stdout, st.stdout
        assert f"problem: partition mismatch on queue {QUEUE}: {stranded} task(s)" in st.stdout, st.stdout
        st2 = json.loads(plaita(redis_url, "status", "--partitions", "2", "--json").stdout)
        assert st2["partitions_count"] == 2 and any(f"{stranded} task(s)" in p for p in st2["problems"])
        wk = plaita(redis_url, "workers")
        assert wk.returncode == 0 and "PARTITIONS" in wk.stdout, wk.stdout
        assert "problem: partition mismatch" in wk.stderr, wk.stderr
        entry = w.registry_entry(redis.Redis.from_url(redis_url))
        assert entry is not None and entry["partitions"] == 2
        assert entry["runs"] == {"handler": "tests.support.handlers:record"}
        assert w.terminate() == 0
    assert stranded > 0  # the scenario strands tasks (10 of 12 with these bodies)


def test_workers_with_different_partition_counts_report_each_other(redis_url: str, tmp_path: Path) -> None:
    with ops_worker(redis_url, tmp_path, "--partitions", "2", name="a2") as a:
        wait_until(lambda: a.registry_entry(redis.Redis.from_url(redis_url)) is not None, 10, "a registered")
        with ops_worker(redis_url, tmp_path, "--partitions", "4", name="b4", wait_ready=False) as b:
            wait_until(lambda: not_ready_because(b, "different --partitions"), 15, "b not ready")
            lines = error_lines(b.stderr(), "different --partitions")
            assert len(lines) == 1 and "--partitions 2: a2-" in lines[0] and "--partitions 4: b4-" in lines[0]
            wk = plaita(redis_url, "workers")
            assert "different --partitions" in wk.stderr, wk.stderr
            assert b.terminate() == 0
        assert a.terminate() == 0


def test_a_queue_shared_by_handler_and_flow_workers_is_reported(redis_url: str, tmp_path: Path) -> None:
    """Reproduction 10: a flow worker and a handler worker on one queue take each other's tasks."""
    with ops_worker(redis_url, tmp_path, name="h") as h:
        wait_until(lambda: h.registry_entry(redis.Redis.from_url(redis_url)) is not None, 10, "h registered")
        flows = ("--flows", "tests.flows.fleet_v1")
        with ops_worker(redis_url, tmp_path, *flows, name="f", wait_ready=False, env={}) as f:
            wait_until(lambda: not_ready_because(f, "shared by handler workers"), 15, "f not ready")
            wk = plaita(redis_url, "workers")
            assert "shared by handler workers" in wk.stderr and "flows up@1" in wk.stdout, wk.stdout + wk.stderr
            assert len(error_lines(f.stderr(), "shared by handler workers")) == 1
            st = plaita(redis_url, "status")
            assert "problem: queue plaita:test:queue is shared by handler workers" in st.stdout, st.stdout
            assert f.terminate() == 0
        # Alone again: the next check (every minute) clears it; `status` already sees no problem.
        st = plaita(redis_url, "status")
        assert "problem:" not in st.stdout, st.stdout
        assert h.terminate() == 0


def test_stray_streams_are_other_counts_partition_streams_and_the_plain_stream(redis_url: str) -> None:
    """What the check counts as stranded: non-empty streams of this queue another --partitions uses
    (tagged for another count, or the plain queue stream), never our own, empty ones, other types,
    or another queue's; queue names with glob characters are matched literally."""
    from plaita.ops.fleetcheck import problems
    from plaita.store.keyspace import Keyspace
    from plaita.store.stats import stray_streams

    c = redis.Redis.from_url(redis_url)
    q = "plaita:odd*[q]"
    two, four = Keyspace(q, 2, True), Keyspace(q, 4, True)
    for p in range(4):
        c.xadd(four.stream(p), {"payload": "{}"})
    c.xadd(two.stream(1), {"payload": "{}"})  # ours
    c.xadd(q, {"payload": "{}"})  # the plain stream of a producer with one partition
    c.set(f"{q}:{{p9}}", "not a stream")
    c.xadd(f"{q}:{{p7}}", {"payload": "{}"})
    c.xdel(f"{q}:{{p7}}", *[e[0] for e in c.xrange(f"{q}:{{p7}}")])  # empty: nothing waits there
    c.xadd("plaita:oddX[q]:{p3}", {"payload": "{}"})  # another queue the glob would match unescaped
    found, complete = stray_streams(c, two)
    expected = {four.stream(p) for p in range(4)} - {two.stream(p) for p in range(2)} | {q}
    assert complete and set(found) == expected and set(found.values()) == {1}
    lines = problems([], found, queue=q, partitions=2)
    assert len(lines) == 1 and f"{len(expected)} task(s) wait" in lines[0]
    # A worker with one partition (the plain stream) sees every tagged stream as stranded.
    assert set(stray_streams(c, Keyspace(q, 1, False))[0]) == {four.stream(p) for p in range(4)} | {two.stream(1)}
    c.close()
