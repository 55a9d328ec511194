"""Issue 33 item 3 on real worker processes: ``max_concurrent_per_key`` holds across two workers
(one execution per key at a time, in start order per key, other keys alongside), a killed
worker's key slot comes back within the lease TTL, and a running worker obeys limits lowered
and raised by ``plaita limits set`` without a restart."""

from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path

import pytest

from plaita.flows.producer.client import FlowClient
from plaita.store.client import make_client
from plaita.store.executions.flow_limits import FlowLimitStore, flow_keys
from plaita.store.keyspace import Keyspace
from tests.flows import flowdefs
from tests.flows.limitdefs import gate_key, max_key, order_key, running_key
from tests.flows.support import dlq, ledgers
from tests.flows.test_limits_workers import args, handed_back, workers
from tests.support.lease_workers import QUEUE, wait_for, worker_proc
from tests.support.ops import plaita

pytestmark = pytest.mark.redis


def parked(flow_id: str) -> int:
    return FlowLimitStore(flowdefs.client(), Keyspace(QUEUE)).waiting(flow_id)


def count(key: str) -> int:
    return int(flowdefs.client().get(key) or 0)


def test_one_execution_per_key_at_a_time_in_start_order_other_keys_alongside(
    redis_url: str, flows: FlowClient, tmp_path: Path
) -> None:
    """Two workers of three handler threads. Customer a's first execution holds its key (gated):
    a's next two starts park (none handed back, none dead-lettered with ``--max-deliveries 1``)
    while customer b's runs and completes alongside; once a's first ends, a's others run one at
    a time, in the order they were started."""
    c = flowdefs.client()
    with ExitStack() as stack:
        procs = workers(stack, redis_url, tmp_path, 2, *args(5, 5000, "--max-deliveries", "1"))
        a1 = flows.start("keyed", {"customer": "a", "gate": "a1"})
        wait_for(lambda: c.lrange(order_key("keyed:a"), 0, -1) == [a1], 60, "a1 holds customer a")
        rest = [flows.start("keyed", {"customer": "a"}) for _ in range(2)]
        wait_for(lambda: parked("keyed") == 2, 60, "a's other starts parked")
        b1 = flows.start("keyed", {"customer": "b"})
        assert flows.wait(b1, 60)["status"] == "completed"
        assert flows.get(a1)["status"] == "running", "b ran while a1 held customer a"  # type: ignore[index]
        assert count(max_key("keyed")) == 2
        c.set(gate_key("a1"), "1")
        docs = [flows.wait(eid, 60) for eid in [a1, *rest]]
        waits = handed_back(procs)
        assert all(p.terminate() == 0 for p in procs)
    assert [d["status"] for d in docs] == ["completed"] * 3
    assert c.lrange(order_key("keyed:a"), 0, -1) == [a1, *rest]
    assert count(max_key("keyed:a")) == 1
    assert waits == 0 and parked("keyed") == 0 and dlq(c) == []


def test_a_killed_workers_key_slot_comes_back_within_the_lease_ttl(
    redis_url: str, flows: FlowClient, tmp_path: Path
) -> None:
    """The worker running customer k's execution is killed with -9: the key's slot expires within
    the lease TTL, another worker runs the victim again and k's parked starts, one at a time."""
    argv = args(2, 500)
    c = flowdefs.client()
    with ExitStack() as stack:
        (a,) = workers(stack, redis_url, tmp_path, 1, *argv)
        victim = flows.start("keyed", {"customer": "k", "block_first": True})
        wait_for(lambda: c.get(f"plaita:test:blocked:{victim}") == "1", 60, "the victim's step")
        waiting = [flows.start("keyed", {"customer": "k"}) for _ in range(2)]
        wait_for(lambda: parked("keyed") == 2, 60, "k's starts parked")
        b = stack.enter_context(worker_proc(redis_url, tmp_path, "limb", *argv))
        b.wait_reading(60.0)
        client = make_client(redis_url, socket_timeout_s=5.0)
        expiry_ms = float(client.zscore(flow_keys(Keyspace(QUEUE), "keyed", "k").slots, victim) or 0)
        now_s, micros = client.time()
        client.close()
        a.kill9()
        assert expiry_ms > 0 and expiry_ms - (now_s * 1000 + micros // 1000) <= 2000  # within one lease TTL
        docs = [flows.wait(eid, 60) for eid in [victim, *waiting]]
        assert b.terminate() == 0
    assert [d["status"] for d in docs] == ["completed"] * 3
    # The victim lost its place by dying: the sweep may give the expired slot to a parked start
    # before the victim is reclaimed. The parked starts still keep their order.
    ran = c.lrange(order_key("keyed:k"), 0, -1)
    assert sorted(ran) == sorted([victim, *waiting]) and [e for e in ran if e != victim] == waiting
    assert count(max_key("keyed:k")) == 1
    assert [ledgers(eid, ["charge"]) for eid in [victim, *waiting]] == [[1]] * 3
    assert dlq(c) == []


def set_limit(url: str, *flags: str) -> None:
    r = plaita(url, "limits", "set", "tunable", *flags, queue=QUEUE)
    assert r.returncode == 0, r.stderr


def gated_phase(flows: FlowClient, phase: str, n: int) -> list[str]:
    return [flows.start("tunable", {"phase": phase, "gate": f"p{phase}"}) for _ in range(n)]


def test_a_running_worker_obeys_a_raised_and_a_lowered_limit(redis_url: str, flows: FlowClient, tmp_path: Path) -> None:
    """One worker of three handler threads, a flow declaring one slot. Three gated starts: one
    runs, two park; ``plaita limits set --max-concurrent 3`` gives them slots at once (the set
    command promotes them), all three run together. Lowered to 1, three new gated starts: one
    runs, two park. No restart in between."""
    c = flowdefs.client()
    with ExitStack() as stack:
        (w,) = workers(stack, redis_url, tmp_path, 1, *args(5, 5000, "--max-deliveries", "1"))
        first = gated_phase(flows, "1", 3)
        wait_for(lambda: count(running_key("tunable:1")) == 1 and parked("tunable") == 2, 60, "one runs, two park")
        set_limit(redis_url, "--max-concurrent", "3")
        wait_for(lambda: count(running_key("tunable:1")) == 3, 30, "the raised limit let all three run")
        c.set(gate_key("p1"), "1")
        assert [flows.wait(eid, 60)["status"] for eid in first] == ["completed"] * 3
        set_limit(redis_url, "--max-concurrent", "1")
        second = gated_phase(flows, "2", 3)
        wait_for(lambda: count(running_key("tunable:2")) == 1 and parked("tunable") == 2, 60, "one runs, two park")
        shown = plaita(redis_url, "limits", "show", "tunable", "--json", queue=QUEUE)
        c.set(gate_key("p2"), "1")
        assert [flows.wait(eid, 60)["status"] for eid in second] == ["completed"] * 3
        assert w.terminate() == 0
    assert shown.returncode == 0, shown.stderr
    row = json.loads(shown.stdout)
    assert (row["flow_id"], row["max_concurrent"], row["running"], row["waiting"]) == ("tunable", 1, 1, 2)
    assert count(max_key("tunable:1")) == 3 and count(max_key("tunable:2")) == 1
    assert dlq(c) == []


def test_limits_cli_flags_and_output(redis_url: str) -> None:
    """Bad flags exit 2 with one line; ``set``, ``show`` and ``clear`` print JSON with ``--json``."""
    for bad in (
        ["set", "f"],
        ["set", "f", "--max-concurrent", "0"],
        ["set", "f", "--per-key", "x"],
        ["set", "f", "--max-starts-per-s", "-1"],
        ["show", "a", "b"],
        ["nope"],
    ):
        r = plaita(redis_url, "limits", *bad, queue=QUEUE)
        assert r.returncode == 2, (bad, r.stdout, r.stderr)
        assert "Traceback" not in r.stderr and r.stderr.strip()
    r = plaita(redis_url, "limits", "set", "f", "--per-key", "2", "--max-starts-per-s", "5", "--json", queue=QUEUE)
    assert r.returncode == 0 and json.loads(r.stdout) == {
        "flow_id": "f",
        "max_starts_per_s": 5.0,
        "max_concurrent_per_key": 2,
    }
    r = plaita(redis_url, "limits", "show", "--json", queue=QUEUE)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == [
        {
            "flow_id": "f",
            "max_concurrent": None,
            "max_starts_per_s": 5.0,
            "max_concurrent_per_key": 2,
            "running": 0,
            "waiting": 0,
        }
    ]
    r = plaita(redis_url, "limits", "show", queue=QUEUE)
    assert r.returncode == 0 and "f" in r.stdout.splitlines()[1]
    r = plaita(redis_url, "limits", "clear", "f", "--json", queue=QUEUE)
    assert r.returncode == 0 and json.loads(r.stdout) == {"flow_id": "f", "cleared": True}
    r = plaita(redis_url, "limits", "show", "--json", queue=QUEUE)
    assert json.loads(r.stdout) == []
