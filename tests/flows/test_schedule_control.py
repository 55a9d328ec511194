"""Schedules at run time (issue 33 item 7): pause (a paused schedule starts nothing, the state in
Redis, shown by ``schedules list``), resume, trigger, and a bounded backfill that starts each
missed tick once (the tick's dedup key: a second backfill starts nothing)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest

from plaita.flows.model.schedules import execution_id_of
from plaita.flows.producer.client import FlowClient
from plaita.flows.schedule_control import ScheduleControl, ScheduleNotFound, TooManyTicks
from plaita.flows.schedule_listing import schedule_rows
from plaita.store.executions.store import ExecutionStore
from tests.flows.test_schedule_ticks import utc
from tests.flows.test_schedules import T0, Env, flow
from tests.support.lease_workers import QUEUE, ROOT, worker_env

pytestmark = pytest.mark.redis

MIN_S = 60


@pytest.fixture
def env(redis_url: str) -> Iterator[Env]:
    e = Env(redis_url, [flow()])
    yield e
    e.client.close()


def _control(env: Env, loaded: bool = True) -> ScheduleControl:
    return ScheduleControl(FlowClient(env.queue), [flow()] if loaded else [])


def cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "plaita", "--quiet", "schedules", "--redis-url", url, "--queue-name", QUEUE, *args]
    return subprocess.run(
        cmd, cwd=ROOT, env=worker_env(url), capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL
    )


def test_a_paused_schedule_starts_nothing_and_resumes_at_its_next_tick(env: Env) -> None:
    control = _control(env)
    assert env.scheduler.run_pass(T0).started == [execution_id_of("sync", T0)]
    assert control.pause("sync", by="ann@test") and not control.pause("sync")  # the second: paused already
    assert control.paused("sync")
    [row] = schedule_rows([], ExecutionStore(env.client, env.queue.keyspace), T0)
    assert row["paused"] is True
    paused = env.scheduler.run_pass(T0 + 5 * MIN_S)
    assert paused.started == [] and paused.dropped == 1
    assert env.scheduler.run_pass(T0 + 10 * MIN_S).started == []
    assert control.resume("sync") and not control.resume("sync")
    assert env.scheduler.run_pass(T0 + 15 * MIN_S).started == [execution_id_of("sync", T0 + 15 * MIN_S)]
    assert env.started_ids() == [execution_id_of("sync", T0), execution_id_of("sync", T0 + 15 * MIN_S)]
    [row] = schedule_rows([], ExecutionStore(env.client, env.queue.keyspace), T0)
    assert row["paused"] is False


def test_backfill_starts_each_missed_tick_once_and_is_bounded(env: Env) -> None:
    env.scheduler.run_pass(T0)
    control = _control(env)
    control.pause("sync")
    env.scheduler.run_pass(T0 + 20 * MIN_S)  # T0+5..T0+20 pass while paused: none started
    ticks = control.backfill("sync", T0, T0 + 20 * MIN_S)
    assert [(utc(t.tick_s), t.started) for t in ticks] == [
        (utc(T0), False),  # ran
        *((utc(T0 + k * 5 * MIN_S), True) for k in range(1, 5)),
    ]
    assert len(env.started_ids()) == 5
    again = control.backfill("sync", T0, T0 + 20 * MIN_S)
    assert [t.started for t in again] == [False] * 5 and len(env.started_ids()) == 5  # twice: nothing new
    body = env.starts()[1]
    assert body["execution_id"] == execution_id_of("sync", T0 + 5 * MIN_S) and body["dedup_key"] == body["execution_id"]
    assert body["params"]["scheduled"]["backfill"] is True  # type: ignore[index]
    with pytest.raises(TooManyTicks, match="more than 100"):
        control.backfill("sync", T0, T0 + 86400)  # 288 ticks
    assert len(control.backfill("sync", T0, T0 + 86400, max_ticks=300, dry_run=True)) == 289
    assert len(env.started_ids()) == 5  # neither the refused one nor the dry run started any
    with pytest.raises(ValueError, match="from <= to <= now"):
        control.backfill("sync", T0 + 60, T0)


def test_trigger_starts_one_execution_now_and_unknown_schedules_are_refused(env: Env) -> None:
    env.scheduler.run_pass(T0)
    control = _control(env, loaded=False)  # the schedule a keeper ran, without the flow module
    eid = control.trigger("sync")
    assert eid.startswith("schedule:sync:trigger:") and env.started_ids()[-1] == eid
    assert env.starts()[-1]["params"]["scheduled"]["trigger"] is True  # type: ignore[index]
    with pytest.raises(ScheduleNotFound):
        control.pause("nope")
    with pytest.raises(ScheduleNotFound):
        control.backfill("nope", T0, T0 + 60)


def test_the_cli_pauses_lists_backfills_triggers_and_resumes(env: Env, redis_url: str) -> None:
    env.scheduler.run_pass(T0)
    r = cli(redis_url, "pause", "sync")
    assert r.returncode == 0 and r.stdout.strip() == "schedule of sync paused", r.stderr
    r = cli(redis_url, "list", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)[0]["paused"] is True
    assert "sync (paused)" in cli(redis_url, "list").stdout
    frm, to = "2026-12-01T12:00:00Z", "2026-12-01T12:10:00Z"
    r = cli(redis_url, "backfill", "sync", "--from", frm, "--to", to, "--json")
    assert r.returncode == 0, r.stderr
    assert [t["started"] for t in json.loads(r.stdout)["ticks"]] == [False, True, True]
    r = cli(redis_url, "backfill", "sync", "--from", frm, "--to", to)
    assert r.returncode == 0 and "3 tick(s) in range, 0 started, 3 ran already" in r.stdout, r.stdout
    r = cli(redis_url, "backfill", "sync", "--from", "2026-11-01T00:00:00Z", "--to", to)
    assert r.returncode == 2 and "--max-ticks" in r.stderr and "Traceback" not in r.stderr
    r = cli(redis_url, "backfill", "sync", "--from", "yesterday")
    assert r.returncode == 2 and "ISO 8601" in r.stderr
    r = cli(redis_url, "trigger", "sync", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["execution_id"].startswith("schedule:sync:trigger:")
    r = cli(redis_url, "resume", "sync")
    assert r.returncode == 0 and r.stdout.strip() == "schedule of sync resumed"
    r = cli(redis_url, "pause", "nope")
    assert r.returncode == 1 and "no schedule of flow 'nope'" in r.stderr
    assert len(env.started_ids()) == 4
