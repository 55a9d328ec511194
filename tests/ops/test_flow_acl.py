"""Least privilege for flows: the documented flow worker ACL runs every flow path (worker with an
embedded keeper, and ``plaita keeper``), the producer ACL every ``FlowClient`` / ``plaita
executions`` call, with nothing denied; and both refuse what they do not need."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis

from plaita.flows.model.definition import load_flows
from plaita.flows.model.execution import Execution
from plaita.flows.producer.client import ExecutionNotFound, FlowClient
from plaita.store.acl import ADMIN_ACL_RULES, FLOW_WORKER_ACL_RULES, PRODUCER_ACL_RULES
from plaita.store.executions.execution_io import create_now
from plaita.store.executions.flow_limits import FlowLimitStore
from plaita.store.keyspace import Keyspace
from plaita.store.leases import Lease
from tests.flows.support import Harness
from tests.ops import test_security
from tests.ops.test_security import OPERATIONS_DOC, MakeUser, _denials
from tests.support.ops import QUEUE, ROOT, clean_env, plaita, plaita_json, wait_until

pytestmark = pytest.mark.redis

#: test_security's fixture: ACL users on the shared private server, deleted afterwards.
acl_user = test_security.acl_user

FLOWS = "tests.ops.acl_flows"
ENDED = ("completed", "error", "cancelled")
#: Commands no plaita user may ever have (the rules are also checked for them by name).
FORBIDDEN = ("+@all", "+config", "+flushall", "+flushdb", "+keys", "+acl", "+debug", "+eval ", "+shutdown")


@contextmanager
def flow_worker(url: str, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``plaita worker --flows tests.ops.acl_flows --keeper``; killed afterwards if still running."""
    cmd = [
        sys.executable, "-m", "plaita", "worker", "--redis-url", url, "--queue-name", QUEUE,
        "--flows", FLOWS, "--keeper", "--concurrency", "4", "--read-block-ms", "200", "--drain-timeout-s", "5",
    ]  # fmt: skip
    with open(tmp_path / "worker.stderr", "wb") as err:
        proc = subprocess.Popen(cmd, cwd=str(ROOT), env=clean_env(), stdout=subprocess.DEVNULL, stderr=err)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


@contextmanager
def worker_and_client(
    acl_user: MakeUser, tmp_path: Path, user: str, rules: str
) -> Iterator[tuple[subprocess.Popen[bytes], FlowClient, str]]:
    """A flow worker under the flow worker's user, and a FlowClient (and its URL) under ``user``."""
    worker_url = acl_user("plaita-flow-worker", "flow-pw", FLOW_WORKER_ACL_RULES)
    url = acl_user(user, f"{user}-pw", rules)
    with flow_worker(worker_url, tmp_path) as proc, FlowClient.from_url(url, queue_name=QUEUE) as flows:
        yield proc, flows, url


def stop(proc: subprocess.Popen[bytes], tmp_path: Path) -> str:
    """SIGTERM the worker, expect a clean exit, return its log (which must show no refusal)."""
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0
    log = (tmp_path / "worker.stderr").read_text(encoding="utf-8")
    assert "NOPERM" not in log and "NoPermission" not in log and "Redis failed" not in log, log
    return log


def status_of(flows: FlowClient, eid: str) -> str | None:
    return (flows.get(eid) or {}).get("status")


def wait_status(flows: FlowClient, eid: str, status: str) -> None:
    wait_until(lambda: status_of(flows, eid) == status, 30, f"{eid} to be {status}")


def wait_failed_again(flows: FlowClient, eid: str, restarts: int) -> None:
    """Until ``eid`` was restarted ``restarts`` times (its history says so) and failed again."""

    def failed_again() -> bool:
        doc = flows.get(eid) or {}
        seen = sum(1 for entry in doc.get("history", []) if "restarted" in entry.values())
        return seen == restarts and doc.get("status") == "error"

    wait_until(failed_again, 30, f"{eid} restarted {restarts} time(s) and failed again")


class TestDocs:
    def test_docs_quote_the_flow_rules_the_tests_use(self) -> None:
        doc = OPERATIONS_DOC.read_text(encoding="utf-8")
        assert f"ACL SETUSER plaita-flow-worker reset on >CHANGE-ME {FLOW_WORKER_ACL_RULES}" in doc
        assert f"ACL SETUSER plaita-producer reset on >CHANGE-ME {PRODUCER_ACL_RULES}" in doc

    def test_rules_hold_no_dangerous_command(self) -> None:
        for rules in (FLOW_WORKER_ACL_RULES, PRODUCER_ACL_RULES):
            assert not [f for f in FORBIDDEN if f in rules + " "], rules
            assert rules.startswith("resetkeys ~plaita:* resetchannels ") and " -@all " in rules


class TestFlowWorkerAcl:
    def test_flow_worker_with_keeper_runs_every_flow_path(
        self, acl_user: MakeUser, rclient: redis.Redis, tmp_path: Path
    ) -> None:
        """Children, a durable sleep, ctx.publish, staged writes, a limited flow, a tenant, a deadline
        and a once-a-second schedule, under the flow worker and producer ACLs: no denial."""
        worker_url = acl_user("plaita-flow-worker", "flow-pw", FLOW_WORKER_ACL_RULES)
        producer_url = acl_user("plaita-producer", "producer-pw", PRODUCER_ACL_RULES)
        with flow_worker(worker_url, tmp_path) as proc, FlowClient.from_url(producer_url, queue_name=QUEUE) as flows:
            tenant = flows.for_tenant("t1")
            parent = flows.start("acl-parent", {"n": 3})
            tenant_parent = tenant.start("acl-parent", {"n": 2})
            limited = [flows.start("acl-limited") for _ in range(3)]
            keyed = [flows.start("acl-keyed", {"who": "w:1"}) for _ in range(3)]
            late = flows.start("acl-waiter", {"sleep_s": 20}, deadline_s=1)
            assert flows.wait(parent, 30)["results"]["tally"] == {"sum": 6}
            assert tenant.wait(tenant_parent, 30)["results"]["tally"] == {"sum": 2}
            assert [flows.wait(e, 30)["status"] for e in limited] == ["completed"] * 3
            assert [flows.wait(e, 30)["status"] for e in keyed] == ["completed"] * 3
            ended = flows.wait(late, 30)
            assert ended["status"] == "cancelled" and ended["error"]["type"] == "DeadlineExceeded", ended
            assert flows.get_event(parent, "progress") == {"sum": 6}
            assert flows.events(parent) == {"progress": {"sum": 6}}
            wait_until(lambda: int(rclient.get("plaita:test:acl:ticks") or 0) >= 2, 30, "two schedule ticks run")
            stop(proc, tmp_path)
        assert rclient.get("plaita:test:acl:tally") == "2"  # each parent's staged write (both tenants), once
        assert sorted(rclient.lrange("plaita:test:acl:done", 0, -1)) == sorted([parent, tenant_parent])
        assert "t1" in rclient.smembers("plaita:tenants")
        assert _denials(rclient) == [], "no command of a flow path may be denied, not even an ignored one"

    def test_standalone_keeper_recovers_an_orphan_and_reaps_a_zombie(
        self, acl_user: MakeUser, rclient: redis.Redis, redis_url: str, tmp_path: Path
    ) -> None:
        """``plaita keeper --once`` under the flow worker ACL: a recovery retry, a zombie marked
        error (its WATCH compare-and-set) and a schedule tick; no denial."""
        keeper_url = acl_user("plaita-flow-worker", "flow-pw", FLOW_WORKER_ACL_RULES)
        h = Harness(redis_url, flows=load_flows([FLOWS]))
        try:
            _orphan(h, "fresh", age_s=0)
            _orphan(h, "zombie", age_s=600)
        finally:
            h.close()
        args = ("--flows", FLOWS, "--once", "--orphan-grace-s", "0", "--zombie-after-s", "300")
        done = plaita(keeper_url, "keeper", *args, timeout_s=60)
        assert done.returncode == 0, done.stderr
        assert "NOPERM" not in done.stderr and "NoPermission" not in done.stderr, done.stderr
        zombie = json.loads(rclient.get("plaita:execution:zombie") or "{}")
        assert zombie.get("status") == "error", zombie
        bodies = [json.loads(fields["payload"]) for _, fields in rclient.xrange(QUEUE)]
        assert "fresh" in [b.get("execution_id") for b in bodies], bodies
        assert _denials(rclient) == []


def _orphan(h: Harness, eid: str, *, age_s: float) -> None:
    """A running execution whose worker died before its first step: state, no task, no lease."""
    lease = h.leases.acquire(eid)
    assert isinstance(lease, Lease)
    doc = Execution.start(eid, h.runner.flows.get("acl-kid"), {"item": 1}, dedup_key=None, now_s=time.time() - age_s)
    body = doc.to_doc()
    assert create_now(h.store, eid, lease.generation, json.dumps(body), body["created_at"], None)[0] == 1
    h.leases.release(lease)


class TestAdminLimitsAcl:
    def test_the_operator_changes_limits_at_run_time(self, acl_user: MakeUser, rclient: redis.Redis) -> None:
        """``plaita limits set | show | clear`` under the admin ACL, with a start parked behind a held
        slot and one behind a busy concurrency key: the raised limits put both back on the stream
        (the sweep script and the XADD run as the operator); nothing denied."""
        admin_url = acl_user("plaita-admin", "admin-pw", ADMIN_ACL_RULES)
        store = FlowLimitStore(rclient, Keyspace(QUEUE))
        for flow_id, key in (("acl-gate", None), ("acl-keyed", "w:1")):
            body = {"type": "start", "flow_id": flow_id, "execution_id": f"parked-{flow_id}", "params": {"who": key}}
            for member, park in (("holder", None), (body["execution_id"], (1.0, body, None))):
                store.acquire(
                    flow_id, member, "tok", max_concurrent=1, ttl_s=30, starts_per_s=0, burst=1, park=park, key=key
                )
            store.register_parking(flow_id)
        assert plaita_json(admin_url, "limits", "set", "acl-gate", "--max-concurrent", "2")["max_concurrent"] == 2
        assert plaita_json(admin_url, "limits", "set", "acl-keyed", "--per-key", "2")["max_concurrent_per_key"] == 2
        requeued = [json.loads(f["payload"])["execution_id"] for _, f in rclient.xrange(QUEUE)]
        assert sorted(requeued) == ["parked-acl-gate", "parked-acl-keyed"]
        rows = plaita_json(admin_url, "limits", "show")
        assert [(r["flow_id"], r["max_concurrent"], r["max_concurrent_per_key"]) for r in rows] == [
            ("acl-gate", 2, None),
            ("acl-keyed", None, 2),
        ]
        assert plaita_json(admin_url, "limits", "clear", "acl-gate")["cleared"] is True
        assert _denials(rclient) == [], "no command of `plaita limits` may be denied"


class TestProducerAcl:
    @pytest.mark.timeout(240)  # a dozen CLI processes: each interpreter start is seconds on a loaded machine
    def test_producer_steers_and_reads_executions(
        self, acl_user: MakeUser, rclient: redis.Redis, tmp_path: Path
    ) -> None:
        """start, resume, cancel, retry, wait, show, list and enqueue, through FlowClient and the CLI."""
        with worker_and_client(acl_user, tmp_path, "plaita-producer", PRODUCER_ACL_RULES) as (
            proc,
            flows,
            producer_url,
        ):
            waiting, doomed = flows.start("acl-waiter"), flows.start("acl-waiter")
            failed = flows.start("acl-failing", dedup_key="once")  # a dedup key: the producer reads it
            wait_status(flows, waiting, "suspended")
            flows.resume(waiting, "event", data={"x": 1})
            assert flows.wait(waiting, 30)["results"]["wait_event"] == {"resume": "event", "data": {"x": 1}}
            wait_status(flows, doomed, "suspended")
            flows.cancel(doomed)
            assert flows.wait(doomed, 30)["status"] == "cancelled"
            with pytest.raises(ExecutionNotFound):  # it looked for a queued start (XRANGE)
                flows.cancel("never-started")
            assert flows.wait(failed, 30)["status"] == "error"
            flows.retry(failed)
            wait_failed_again(flows, failed, 1)
            _cli_round(producer_url, flows, failed)
            stop(proc, tmp_path)
        assert _denials(rclient) == [], "no producer or worker command may be denied"


def _cli(url: str, *args: str) -> Any:
    done = plaita(url, *args, timeout_s=60)  # a loaded machine: interpreter start and `--wait` included
    assert done.returncode == 0, f"plaita {' '.join(args)}: {done.stderr}"
    return done.stdout


def _cli_round(url: str, flows: FlowClient, failed: str) -> None:
    """Every ``plaita executions`` action and ``plaita enqueue`` under the producer user."""
    started = json.loads(_cli(url, "executions", "start", "acl-parent", "--input", '{"n": 1}', "--wait", "--json"))
    assert started["status"] == "completed", started
    _cli(url, "executions", "start", "acl-waiter", "--execution-id", "cli-w", "--tenant", "t2", "--json")
    t2 = flows.for_tenant("t2")
    wait_status(t2, "cli-w", "suspended")
    _cli(url, "executions", "resume", "cli-w", "--tenant", "t2", "--data", '{"y": 2}')
    assert t2.wait("cli-w", 30)["status"] == "completed"
    _cli(url, "executions", "start", "acl-waiter", "--execution-id", "cli-c")
    wait_status(flows, "cli-c", "suspended")
    _cli(url, "executions", "cancel", "cli-c")
    wait_status(flows, "cli-c", "cancelled")
    _cli(url, "executions", "retry", failed)
    wait_failed_again(flows, failed, 2)
    assert started["execution_id"] in _cli(url, "executions", "list", "--json")
    assert json.loads(_cli(url, "executions", "show", started["execution_id"], "--json"))
    assert "cli-w" in _cli(url, "executions", "list", "--tenant", "t2", "--status", "completed", "--json")
    _cli(url, "enqueue", json.dumps({"type": "start", "flow_id": "acl-limited", "params": {}, "execution_id": "cli-e"}))
    wait_status(flows, "cli-e", "completed")


class TestRestrictive:
    def test_producer_and_flow_worker_are_refused_what_they_do_not_need(
        self, acl_user: MakeUser, rclient: redis.Redis
    ) -> None:
        producer = redis.Redis.from_url(acl_user("plaita-producer", "producer-pw", PRODUCER_ACL_RULES))
        worker = redis.Redis.from_url(acl_user("plaita-flow-worker", "flow-pw", FLOW_WORKER_ACL_RULES))
        rclient.xgroup_create(QUEUE, "plaita-workers", id="0", mkstream=True)
        refused: list[tuple[redis.Redis, tuple[Any, ...]]] = [
            (producer, ("XREADGROUP", "GROUP", "plaita-workers", "c", "STREAMS", QUEUE, ">")),
            (producer, ("CONFIG", "GET", "maxmemory")),
            (producer, ("EVAL", "return 1", "0")),  # its start's script is EVALSHA; no script of its own
            (producer, ("ZREM", "plaita:executions:status:queued", "x")),
            (producer, ("PUBLISH", "plaita:control", "x")),
            (producer, ("DEL", "plaita:execution:x")),
            (producer, ("GET", "other:key")),
            (worker, ("CONFIG", "GET", "maxmemory")),
            (worker, ("KEYS", "*")),
            (worker, ("FLUSHALL",)),
            (worker, ("EVAL", "return 1", "0")),
            (worker, ("GET", "other:key")),
            (worker, ("SUBSCRIBE", "other")),
        ]
        try:
            for client, command in refused:
                with pytest.raises(redis.exceptions.NoPermissionError):
                    client.execute_command(*command)
        finally:
            producer.close()
            worker.close()
