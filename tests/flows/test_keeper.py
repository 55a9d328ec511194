"""The keeper on real Redis: orphans recovered once, live and suspended executions left alone,
deadlines, zombies, dry runs, one acting keeper, and a Redis freeze and restart."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from plaita.flows.keeper.keeper import Keeper, KeeperSettings
from plaita.flows.model import bodies as model
from plaita.flows.model.execution import Execution
from plaita.ops.keeper_build import build_keeper
from plaita.store.client import make_client
from plaita.store.executions.execution_io import create_now
from plaita.store.executions.keeper_store import keeper_lease_key
from plaita.store.executions.store import ExecutionStore
from plaita.store.leases import Lease
from plaita.store.streams.queue import StreamQueue
from tests.flows import flowdefs
from tests.flows.support import Harness, harness, ledgers, start
from tests.support.lease_workers import QUEUE, ROOT, wait_for, worker_env, worker_proc
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.redis

FAST = KeeperSettings(interval_s=0.1, orphan_grace_s=0.0, lease_ttl_s=2.0, retry_cooldown_s=60)


def make_orphan(h: Harness, eid: str, flow: str = "ledger3", *, keep_lease: bool = False, age_s: float = 0) -> Lease:
    """A running execution whose worker died before its first step: state, no task, no lease."""
    lease = h.leases.acquire(eid)
    assert isinstance(lease, Lease)
    now_s = time.time() - age_s
    doc = Execution.start(eid, h.runner.flows.get(flow), {}, dedup_key=None, now_s=now_s).to_doc()  # type: ignore[arg-type]
    code, _, _ = create_now(h.store, eid, lease.generation, json.dumps(doc), doc["created_at"], None)
    assert code == 1
    if not keep_lease:
        h.leases.release(lease)
    return lease


def queued(h: Harness) -> list[dict[str, object]]:
    return [json.loads(f[b"payload"]) for _, f in h.client.xrange(QUEUE)]  # type: ignore[union-attr]


def keeper(h: Harness, settings: KeeperSettings = FAST, **clock: float) -> Keeper:
    offset = clock.get("offset_s", 0.0)
    return build_keeper(h.store, h.queue, settings, clock=lambda: time.time() + offset)


def test_orphan_is_recovered_exactly_once(h: Harness) -> None:
    make_orphan(h, "k1")
    k = keeper(h)
    assert k.run_once().retries == ["k1"]
    assert k.run_once().retries == []  # the cooldown: one retry, however many passes
    tasks = queued(h)
    assert [(t["execution_id"], t["resume_type"]) for t in tasks] == [("k1", "retry")]
    doc = h.run(tasks[0])  # type: ignore[arg-type]
    assert doc is not None and doc["status"] == "completed"
    assert ledgers("k1", ["one", "two", "three"]) == [1, 1, 1]
    assert k.run_once().retries == []


def test_live_suspended_and_queued_executions_are_left_alone(h: Harness) -> None:
    make_orphan(h, "live", keep_lease=True)  # its worker is alive: lease held
    h.run(start("sus", "signup"))  # suspended without a deadline
    make_orphan(h, "queued")
    h.queue.enqueue(model.resume_body("queued", "retry"))  # a task is waiting for it already
    report = keeper(h).run_once()
    assert report.retries == [] and report.timeouts == [] and report.orphaned == []
    assert len(queued(h)) == 1


def test_suspension_deadline_enqueues_timeout_once(h: Harness) -> None:
    h.run(start("dl", "signup", timeout_s=0.05))
    time.sleep(0.1)  # let the 50 ms deadline pass (the keeper reads wall-clock deadlines)
    k = keeper(h)
    assert k.run_once().timeouts == ["dl"]
    assert k.run_once().timeouts == []  # re-armed for the cooldown, not sent every pass
    [task] = queued(h)
    assert task["resume_type"] == "timeout"
    doc = h.run(task)  # type: ignore[arg-type]
    assert doc is not None and doc["status"] == "completed" and doc["state"]["resumed_by"] == "timeout"


def test_zombie_is_marked_orphaned_error(h: Harness) -> None:
    make_orphan(h, "z")
    report = keeper(
        h, KeeperSettings(interval_s=0.1, orphan_grace_s=0, lease_ttl_s=2, zombie_after_s=60), offset_s=120
    ).run_once()
    assert report.orphaned == ["z"] and report.retries == []
    doc = h.store.get("z")
    assert doc is not None and doc["status"] == "error" and doc["error"]["type"] == "Orphaned"
    assert h.client.zscore("plaita:executions:status:error", "z") is not None
    assert h.client.zscore("plaita:executions:status:running", "z") is None


def test_dry_run_changes_nothing(h: Harness) -> None:
    make_orphan(h, "dry")
    h.run(start("dl2", "signup", timeout_s=0))
    settings = KeeperSettings(interval_s=0.1, orphan_grace_s=0, lease_ttl_s=2, dry_run=True)
    k = keeper(h, settings)
    report = k.run_once()
    assert report.retries == ["dry"] and report.timeouts == ["dl2"]
    assert queued(h) == [] and h.client.exists("plaita:execution:keeper-retry:dry") == 0
    assert k.run_once().retries == ["dry"]  # still would: nothing was marked


def test_one_keeper_acts_at_a_time(h: Harness) -> None:
    make_orphan(h, "one")
    a, b = keeper(h), keeper(h)
    assert a.run_once().acting and not b.run_once().acting
    assert len(queued(h)) == 1
    assert a.run(once=True) == 0  # a stopping keeper hands its lease over at once
    assert b.run_once().acting


def test_keeper_rides_out_a_freeze_and_a_restart(private_redis: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLAITA_TEST_REDIS_URL", private_redis.url)
    flowdefs._clients.clear()
    with harness(private_redis.url) as h:
        kclient = make_client(private_redis.url, socket_timeout_s=0.5)
        kqueue = StreamQueue(kclient, stream=QUEUE, group="g", consumer="k", dlq_key="d", dlq_max_len=1)
        k = build_keeper(ExecutionStore(kclient), kqueue, FAST)
        thread = threading.Thread(target=lambda: k.run(), daemon=True)
        thread.start()
        try:
            private_redis.freeze()
            time.sleep(1.5)  # several passes fail against the frozen server
            assert thread.is_alive()
            private_redis.thaw()
            make_orphan(h, "after-freeze")
            wait_for(lambda: len(queued(h)) == 1, 10, "retry enqueued after the freeze")
            private_redis.restart()
            make_orphan(h, "after-restart")
            wait_for(lambda: len(queued(h)) == 2, 10, "retry enqueued after the restart")
            private_redis.freeze()
            time.sleep(0.3)
            stop_at = time.monotonic()
            k.request_stop()
            thread.join(2)
            assert not thread.is_alive() and time.monotonic() - stop_at < 1.0
        finally:
            if private_redis.frozen:
                private_redis.thaw()
            k.request_stop()
            kclient.close()
    assert {t["execution_id"] for t in queued_on(private_redis)} == {"after-freeze", "after-restart"}


def queued_on(server: RedisServer) -> list[dict[str, object]]:
    c = server.client()
    try:
        return [json.loads(f[b"payload"]) for _, f in c.xrange(QUEUE)]  # type: ignore[union-attr]
    finally:
        c.close()


def test_orphans_behind_a_page_of_live_executions_are_found(h: Harness) -> None:
    for i in range(5):
        make_orphan(h, f"busy-{i}", keep_lease=True)  # long steps of live workers: oldest scores
    make_orphan(h, "behind")
    settings = KeeperSettings(interval_s=0.1, orphan_grace_s=0, lease_ttl_s=2, batch=2)
    assert keeper(h, settings).run_once().retries == ["behind"]


def test_worker_with_keeper_recovers_an_orphan(
    h: Harness, redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_orphan(h, "emb", age_s=60)  # past the keeper's 10 s grace already
    with worker_proc(redis_url, tmp_path, "kw", "--flows", "tests.flows.flowdefs", "--keeper") as w:
        doc = h.flows.wait("emb", 20)
        assert w.terminate() == 0
    assert doc["status"] == "completed" and ledgers("emb", ["one", "two", "three"]) == [1, 1, 1]
    assert h.client.get(keeper_lease_key(QUEUE)) is None  # handed over on exit
    r = subprocess.run(
        [sys.executable, "-m", "plaita", "worker", "--redis-url", redis_url, "--keeper"],
        cwd=ROOT, env=worker_env(redis_url), capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert r.returncode == 2 and "--flows" in r.stderr


def test_a_keeper_is_built_with_flows_or_a_scheduler_not_both(h: Harness) -> None:
    """``build_keeper`` gives its scheduler the keeper's own door; handed a scheduler, it refuses
    flows it would otherwise silently drop (the scheduler knows its flows)."""
    from plaita.ops.keeper_build import build_scheduler

    k = build_keeper(h.store, h.queue, flows=flowdefs.FLOWS)
    assert k.scheduler.store is k.io.schedules  # one door for both
    with pytest.raises(ValueError, match="flows= or scheduler="):
        build_keeper(h.store, h.queue, flows=flowdefs.FLOWS, scheduler=build_scheduler([], h.queue))
