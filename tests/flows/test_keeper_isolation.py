"""The keeper isolates every schedule and every key (issue 29, item 2): a cron that never fires is
refused when its flow is defined (exit 2, one line naming the flow); a bad schedule met at run time
(one that cannot be stepped, or a bad one recorded in Redis) is skipped with one error line while
the rest of the pass goes on; a wrong-typed index of one tenant never stops another tenant's
wake-ups, nor the rest of the pass; ``schedules list`` and the dashboard show a bad schedule as an
error row. Real redis-servers."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time

import pytest

from plaita.flows import Flow, Schedule
from plaita.flows.keeper.keeper import KeeperSettings
from plaita.flows.schedule_listing import schedule_rows
from plaita.ops.keeper_build import build_keeper, build_scheduler
from plaita.store.executions.schedule_store import SCHEDULES_KEY, schedule_key
from plaita.store.executions.store import ExecutionStore
from plaita.store.keyspace import TENANTS_KEY
from tests.flows.support import Harness, start
from tests.flows.test_schedules import T0
from tests.flows.test_tenants import _orphan
from tests.support.lease_workers import QUEUE, ROOT, worker_env

pytestmark = pytest.mark.redis

FAST = KeeperSettings(interval_s=0.1, orphan_grace_s=0.0, lease_ttl_s=2.0, retry_cooldown_s=60)


def scheduled(flow_id: str, cron: str = "*/5 * * * *") -> Flow:
    f = Flow(flow_id, schedule=Schedule(cron))
    f.step(lambda ctx: None, name="run")
    return f


def queued(h: Harness) -> list[dict[str, object]]:
    return [json.loads(f[b"payload"]) for _, f in h.client.xrange(QUEUE)]  # type: ignore[union-attr]


# -- refused at definition ----------------------------------------------------------------------


@pytest.mark.parametrize("command", [("keeper", "--once"), ("worker",), ("schedules", "list")])
def test_a_never_firing_cron_exits_2_with_one_line_naming_the_flow(command: tuple[str, ...]) -> None:
    url = "redis://127.0.0.1:1/0"  # never reached: the module is refused first
    cmd = [sys.executable, "-m", "plaita", *command, "--flows", "tests.flows.schedule_never", "--redis-url", url]
    done = subprocess.run(cmd, cwd=str(ROOT), env=worker_env(url), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert "never-fires" in line and "never fires" in line and "Traceback" not in done.stderr


# -- skipped at run time ------------------------------------------------------------------------


def unsteppable(flow_id: str) -> Flow:
    """A flow whose schedule passed validation but cannot be stepped at run time (as an older
    plaita accepted ``0 0 30 2 *``)."""
    f = scheduled(flow_id)
    assert isinstance(f.schedule, Schedule)
    object.__setattr__(f.schedule, "cron", "0 0 30 2 *")
    return f


def test_a_schedule_that_cannot_be_stepped_skips_only_itself(h: Harness, caplog: pytest.LogCaptureFixture) -> None:
    _orphan(h, h.store, "o1")
    doc = h.run(start("s1", "signup", timeout_s=0.01))  # a suspension past its deadline
    assert doc is not None and doc["status"] == "suspended"
    scheduler = build_scheduler([unsteppable("broken"), scheduled("good")], h.queue, store=h.store)
    # Past the suspension's deadline and the orphan's grace.
    keeper = build_keeper(h.store, h.queue, FAST, clock=lambda: time.time() + 5.0, scheduler=scheduler)
    with caplog.at_level(logging.ERROR, logger="plaita"):
        report = keeper.run_once()
        keeper.run_once()
    assert report.timeouts == ["s1"] and report.retries == ["o1"]
    # The good schedule ran in the same pass (on its first sight only ticks within grace count).
    assert h.client.exists(schedule_key("good")) == 1
    assert schedule_key("broken") in report.corrupt
    errors = [r.getMessage() for r in caplog.records if "broken" in r.getMessage()]
    assert len(errors) == 1 and "0 0 30 2 *" in errors[0], errors  # one line, not one per pass


def test_a_bad_schedule_recorded_in_redis_is_a_row_with_an_error_not_a_traceback(h: Harness, redis_url: str) -> None:
    """What an older keeper recorded for a flow whose module is not loaded here."""
    h.client.hset(schedule_key("legacy"), mapping={"cron": "0 0 30 2 *", "tz": "UTC", "missed": "skip"})
    h.client.hset(schedule_key("fine"), mapping={"cron": "0 9 * * *", "tz": "UTC", "missed": "skip"})
    h.client.sadd(SCHEDULES_KEY, "legacy", "fine")
    rows = {r["flow"]: r for r in schedule_rows([], ExecutionStore(h.client), T0)}
    assert "never fires" in rows["legacy"]["error"]
    assert rows["fine"]["cron"] == "0 9 * * *" and "error" not in rows["fine"]
    done = subprocess.run(
        [sys.executable, "-m", "plaita", "schedules", "list", "--redis-url", redis_url],
        cwd=str(ROOT),
        env=worker_env(redis_url),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("legacy") and "never fires" in line
    assert "fine" in done.stdout


# -- one tenant's wrong-typed index -------------------------------------------------------------


@pytest.mark.parametrize("index", ["plaita:t1:executions:deadlines", "plaita:t1:executions:status:running"])
def test_a_wrong_typed_index_of_one_tenant_never_stops_another_tenants_wakes(
    h: Harness, index: str, caplog: pytest.LogCaptureFixture
) -> None:
    t2 = h.store.for_tenant("t2")
    _orphan(h, t2, "o2")
    doc = h.run({**start("s2", "signup", timeout_s=0.01), "tenant_id": "t2"})
    assert doc is not None and doc["status"] == "suspended"
    h.client.sadd(TENANTS_KEY, "t1")  # t1 sorts before t2: its bad index is met first
    h.client.set(index, "not an index")
    keeper = build_keeper(h.store, h.queue, FAST, clock=lambda: time.time() + 5.0)
    with caplog.at_level(logging.WARNING, logger="plaita"):
        report = keeper.run_once()
        again = keeper.run_once()
    assert report.timeouts == ["t2/s2"] and report.retries == ["t2/o2"]
    assert index in report.corrupt and index in again.corrupt and keeper.corrupt_skips == 2
    assert [b["execution_id"] for b in queued(h)] == ["s2", "o2"]
    warned = [r.getMessage() for r in caplog.records if index in r.getMessage()]
    assert len(warned) == 1, warned  # logged once per keeper process
    assert h.client.get(index) == b"not an index"  # left for an operator


def test_a_wrong_typed_deadlines_index_does_not_stop_the_deadline_checks_between_passes(h: Harness) -> None:
    doc = h.run({**start("s2", "signup", timeout_s=0.01), "tenant_id": "t2"})
    assert doc is not None and doc["status"] == "suspended"
    h.client.sadd(TENANTS_KEY, "t1")
    h.client.set("plaita:t1:executions:deadlines", "not an index")
    keeper = build_keeper(h.store, h.queue, FAST, clock=lambda: time.time() + 5.0)
    keeper._stores = keeper._tenant_stores()
    # Between full passes the keeper peeks at the earliest deadline of every tenant.
    keeper._until_next_pass(0.3)
    assert [b["execution_id"] for b in queued(h)] == ["s2"]


def test_a_wrong_typed_tenants_set_leaves_the_default_tenant_kept(h: Harness) -> None:
    _orphan(h, h.store, "o1")
    h.client.set(TENANTS_KEY, "not a set")
    report = build_keeper(h.store, h.queue, FAST, clock=lambda: time.time() + 5.0).run_once()
    assert report.retries == ["o1"] and TENANTS_KEY in report.corrupt
