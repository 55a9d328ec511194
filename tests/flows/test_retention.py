"""Retention (issue 33 item 6): ``executions delete`` removes every key an execution owns and
nothing of its neighbours; ``prune`` deletes ended executions in bounded, resumable batches per
tenant; ``cancel-many`` asks first; ``Flow(retention_s=...)`` sets an ended execution's TTL."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from plaita.errors import ConfigError
from plaita.flows import Flow
from plaita.flows.producer.client import FlowClient, NotDeletable
from plaita.flows.retention import index_keep_s
from plaita.store.keyspace import DEFAULT, key_id
from tests.flows import flowdefs, msgdefs, retentiondefs, sleepdefs
from tests.flows.support import Harness, start
from tests.flows.test_sleep import WORKER_ARGS
from tests.support.lease_workers import QUEUE, ROOT, wait_for, worker_env, worker_proc

pytestmark = pytest.mark.redis

ARGS = (*WORKER_ARGS, "--flows", "tests.flows.fanout_flows")
DAY_S = 86400.0


def cli(url: str, *args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    """``plaita executions …`` with no terminal on stdin (as in a script)."""
    cmd = [sys.executable, "-m", "plaita", "--quiet", "executions", "--redis-url", url, "--queue-name", QUEUE, *args]
    return subprocess.run(
        cmd, cwd=ROOT, env=worker_env(url), capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL
    )


@pytest.fixture
def h(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    monkeypatch.setenv("PLAITA_TEST_REDIS_URL", redis_url)
    harness = Harness(redis_url, flows=[*flowdefs.FLOWS, *sleepdefs.FLOWS, *retentiondefs.FLOWS, msgdefs.inbox])
    try:
        yield harness
    finally:
        harness.close()


def _snapshot(client: redis.Redis, victims: set[str]) -> dict[str, Any]:
    """Every key of the server and what it holds (index members of ``victims`` left out)."""
    out: dict[str, Any] = {}
    for raw in client.scan_iter(count=1000):
        key = raw.decode()
        kind = client.type(key).decode()
        if kind == "string":
            out[key] = client.get(key)
        elif kind == "hash":
            out[key] = client.hgetall(key)
        elif kind == "zset":
            out[key] = [m for m in client.zrange(key, 0, -1, withscores=True) if m[0].decode() not in victims]
        elif kind == "set":
            out[key] = client.smembers(key)
        else:
            out[key] = (kind, client.xlen(key) if kind == "stream" else None)
    return out


def _owned_by(key: str, victims: set[str]) -> bool:
    if key.startswith("plaita:test:"):  # the test steps' own data: the application's, not plaita's
        return False
    return bool({key_id(v) for v in victims} & set(key.split(":")))


def test_delete_leaves_no_key_of_the_execution_and_every_key_of_its_neighbours(
    redis_url: str, flows: FlowClient, client: redis.Redis, tmp_path: Path
) -> None:
    """``ord`` (a fan-out parent, with a dedup key) and ``pay`` (published events) are deleted;
    ``or`` and ``ord-1`` (ids that are a prefix of, or start with, ``ord``), ``pa``, ``pay-2`` and
    the children of ``ord`` (executions of their own) keep every key and index entry."""
    with worker_proc(redis_url, tmp_path, "rt", *ARGS) as w:
        for eid in ("ord", "or", "ord-1"):
            flows.start("fan", {"n": 2}, execution_id=eid, dedup_key=f"k-{eid}")
        for eid in ("pay", "pa", "pay-2"):
            flows.start("fixable", {"publish": True}, execution_id=eid)
        for eid in ("ord", "or", "ord-1", "pay", "pa", "pay-2"):
            assert flows.wait(eid, 30)["status"] == "completed"
        assert w.terminate() == 0
    ks = DEFAULT
    for eid in ("ord", "or", "pay"):  # the keys no run leaves behind, written as a fault would
        client.set(ks.crashes_key(eid), 1)
        client.hset(ks.version_wait_key(eid), "since", "1")
        client.set(f"plaita:execution:keeper-retry:{eid}", 1)
        client.set(ks.cancel_key(eid), 1)
    client.zadd(ks.deadlines_key(0), {"ord": 1.0, "or": 1.0})
    assert client.exists("plaita:execution:children:ord:spread:0") and flows.events("pay")
    victims = {"ord", "pay"}
    before = _snapshot(client, victims)
    done = flows.delete("ord", "pay")
    assert [(d.execution_id, d.outcome, d.status) for d in done] == [
        ("ord", "deleted", "completed"),
        ("pay", "deleted", "completed"),
    ]
    after = _snapshot(client, victims)
    assert not [k for k in after if _owned_by(k, victims)], sorted(k for k in after if _owned_by(k, victims))
    expected = {k: v for k, v in before.items() if not _owned_by(k, victims)}
    assert expected.pop(ks.dedup_key(0, "k-ord")) == b"ord"  # its dedup key goes with it
    assert after == expected
    assert client.get(ks.dedup_key(0, "k-ord")) is None and client.get(ks.dedup_key(0, "k-or")) == b"or"
    assert flows.get("ord:spread:0:0") is not None  # a child is an execution of its own
    assert flows.delete("ord") == [type(done[0])("ord", "missing", None)]  # again: nothing left to delete
    flows.start("fan", {"n": 1}, dedup_key="k-ord")  # the dedup key is free again


def test_delete_refuses_an_execution_not_ended_unless_forced(redis_url: str, flows: FlowClient, tmp_path: Path) -> None:
    with worker_proc(redis_url, tmp_path, "rf", *ARGS):
        flows.start("fixable", {"suspend": True}, execution_id="s1")
        flows.start("ledger3", execution_id="d1")
        wait_for(lambda: (flows.get("s1") or {}).get("status") == "suspended", 20, "s1 suspended")
        assert flows.wait("d1", 20)["status"] == "completed"
        with pytest.raises(NotDeletable, match="s1 \\(suspended\\)"):
            flows.delete("d1", "s1")
        assert flows.get("d1") is not None  # refused: none of them deleted
        r = cli(redis_url, "delete", "d1", "s1")
        assert r.returncode == 1 and "--force" in r.stderr and "Traceback" not in r.stderr
        r = cli(redis_url, "delete", "d1", "s1", "--force", "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout) == [
            {"execution_id": "d1", "outcome": "deleted", "status": "completed"},
            {"execution_id": "s1", "outcome": "cancelled_and_deleted", "status": "suspended"},
        ]
    assert flows.get("s1") is None and flows.get("d1") is None


def test_delete_force_says_it_cancelled_first(redis_url: str, flows: FlowClient, tmp_path: Path) -> None:
    with worker_proc(redis_url, tmp_path, "rg", *ARGS):
        flows.start("fixable", {"suspend": True}, execution_id="s2")
        wait_for(lambda: (flows.get("s2") or {}).get("status") == "suspended", 20, "s2 suspended")
        r = cli(redis_url, "delete", "s2", "--force")
    assert r.returncode == 0 and "was suspended: cancelled (--force), then deleted" in r.stdout, r.stdout + r.stderr


def _age(h: Harness, eid: str, status: str, days: float, ns: str = "plaita") -> None:
    """Make ``eid``'s index entry say it ended ``days`` ago (the test cannot wait for days)."""
    h.client.zadd(f"{ns}:executions:status:{status}", {eid: time.time() - days * DAY_S})


def test_prune_deletes_what_ended_before_in_bounded_resumable_batches_per_tenant(h: Harness) -> None:
    for i in range(5):
        h.run(start(f"old{i}", "ledger3"))
        _age(h, f"old{i}", "completed", 10)
    h.run(start("new", "ledger3"))
    h.run({**start("told", "ledger3"), "tenant_id": "t1"})
    _age(h, "told", "completed", 10, ns="plaita:t1")
    h.run(start("err", "flaky", fatal=True))
    doc = h.store.get("err")
    assert doc is not None and doc["status"] == "error"
    _age(h, "err", "error", 10)
    dry = h.flows.prune(time.time() - 7 * DAY_S, dry_run=True)
    assert dry.matched == 6 and dry.deleted == [] and h.store.get("old0") is not None
    first = h.flows.prune(time.time() - 7 * DAY_S, statuses=["completed"], limit=2)
    assert len(first.deleted) == 2 and first.more
    rest = h.flows.prune(time.time() - 7 * DAY_S, statuses=["completed"])
    assert len(rest.deleted) == 3 and not rest.more
    assert [h.store.get(f"old{i}") for i in range(5)] == [None] * 5
    assert h.store.get("new") is not None and h.store.get("err") is not None  # too new; not asked for
    assert h.flows.for_tenant("t1").get("told") is not None  # another tenant's: only with --tenant
    with pytest.raises(ValueError, match="ended executions only"):
        h.flows.prune(time.time(), statuses=["running"])


def test_prune_from_the_cli_per_tenant_and_every_tenant(h: Harness, redis_url: str) -> None:
    h.run(start("a1", "ledger3"))
    _age(h, "a1", "completed", 3)
    h.run({**start("a1", "ledger3"), "tenant_id": "t1"})
    _age(h, "a1", "completed", 3, ns="plaita:t1")
    r = cli(redis_url, "prune", "--ended-before", "2d", "--dry-run", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)[0]["matched"] == 1, r.stderr
    r = cli(redis_url, "--tenant", "t1", "prune", "--ended-before", "4d")
    assert r.returncode == 0 and "tenant t1: 0 execution(s) deleted" in r.stdout, r.stdout
    r = cli(redis_url, "--tenant", "t1", "prune", "--ended-before", "2d")
    assert r.returncode == 0 and "tenant t1: 1 execution(s) deleted" in r.stdout, r.stdout
    assert h.store.get("a1") is not None and h.flows.for_tenant("t1").get("a1") is None
    h.run({**start("a2", "ledger3"), "tenant_id": "t2"})
    _age(h, "a2", "completed", 3, ns="plaita:t2")
    r = cli(redis_url, "prune", "--ended-before", "2d", "--all-tenants", "--json")
    rows = {row["tenant"]: row["deleted"] for row in json.loads(r.stdout)}
    assert r.returncode == 0 and rows == {"": 1, "t1": 0, "t2": 1}, r.stdout
    for bad in (["--ended-before", "soon"], ["--ended-before", "1d", "--status", "running"], []):
        r = cli(redis_url, "prune", *bad)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr


def test_cancel_many_lists_on_a_dry_run_asks_first_and_cancels_only_what_the_filter_selects(
    h: Harness, redis_url: str
) -> None:
    for eid in ("c1", "c2", "c3"):
        h.run(start(eid, "fixable", suspend=True))
    h.run(start("other", "signup", name="x"))
    assert h.store.get("other")["status"] == "suspended"  # type: ignore[index]
    assert sorted(h.flows.cancel_many(["suspended"], "fixable", dry_run=True)) == ["c1", "c2", "c3"]
    r = cli(redis_url, "cancel-many", "--status", "suspended", "--flow", "fixable")
    assert r.returncode == 2 and "--yes" in r.stderr and not h.client.exists("plaita:execution:cancel:c1")
    r = cli(redis_url, "cancel-many", "--flow", "fixable", "--dry-run", "--json")
    assert r.returncode == 0 and sorted(json.loads(r.stdout)["execution_ids"]) == ["c1", "c2", "c3"]
    r = cli(redis_url, "cancel-many", "--status", "suspended", "--flow", "fixable", "--yes")
    assert r.returncode == 0 and "cancelled: 3 execution(s)" in r.stdout, r.stdout + r.stderr
    assert [h.client.exists(f"plaita:execution:cancel:{e}") for e in ("c1", "c2", "c3", "other")] == [1, 1, 1, 0]
    with pytest.raises(ValueError, match="not ended"):
        h.flows.cancel_many(["completed"])


def test_a_flows_retention_is_its_ended_executions_ttl(h: Harness) -> None:
    h.run(start("b1", "brief"))
    h.run(start("f1", "forever"))
    h.run(start("l1", "ledger3"))
    assert 0 < h.client.ttl("plaita:execution:b1") <= 120
    assert h.client.ttl("plaita:execution:f1") == -1
    assert 6 * DAY_S < h.client.ttl("plaita:execution:l1") <= 7 * DAY_S
    week = 7 * 24 * 3600
    assert index_keep_s([Flow("x"), Flow("y", retention_s=30 * 86400)], week) == 30 * 86400
    assert index_keep_s([Flow("x"), Flow("z", retention_s=0)], week) == 0
    assert index_keep_s([Flow("x", retention_s=60)], week) == week
    for bad in (-1, 1.5, True, 11 * 365 * 86400):
        with pytest.raises(ConfigError, match="retention_s"):
            Flow("bad", retention_s=bad)  # type: ignore[arg-type]
