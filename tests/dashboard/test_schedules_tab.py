"""The Schedules tab never answers 500 for what Redis holds (issue 29, items 2 and 3): a schedule
an older keeper ran with a cron that never fires, a schedules set of another type and a record
that is not JSON are rows with their error; a schedule recorded for the queue by a worker shows
without any flow module loaded."""

from __future__ import annotations

import json
import time

import pytest
import redis

from plaita.store.executions.schedule_records import records_key
from plaita.store.executions.schedule_store import SCHEDULES_KEY, schedule_key
from tests.dashboard.conftest import MakeDashboard
from tests.support.ops import QUEUE

pytestmark = pytest.mark.redis


def row(page: str, flow: str) -> str:
    return page.split(f'data-schedule="{flow}"')[1].split("</tr>")[0]


def test_a_never_firing_cron_a_keeper_ran_is_an_error_row(make_dashboard: MakeDashboard, rclient: redis.Redis) -> None:
    rclient.hset(schedule_key("legacy"), mapping={"cron": "0 0 31 4 *", "tz": "UTC", "missed": "skip"})
    rclient.sadd(SCHEDULES_KEY, "legacy")
    answer = make_dashboard().get("/schedules")
    assert answer.status_code == 200
    assert "never fires" in row(answer.text, "legacy")


def test_bad_keys_are_error_rows_and_a_recorded_schedule_shows(
    make_dashboard: MakeDashboard, rclient: redis.Redis
) -> None:
    rclient.set(SCHEDULES_KEY, "not a set")
    good = {"cron": "0 9 * * *", "tz": "Europe/Paris", "missed": "once", "recorded_at_s": time.time()}
    rclient.hset(records_key(QUEUE), mapping={"nightly": json.dumps(good), "garbled": "{"})
    answer = make_dashboard().get("/schedules")
    assert answer.status_code == 200
    page = answer.text
    assert "wrong type" in row(page, SCHEDULES_KEY)
    assert "not JSON" in row(page, "garbled")
    nightly = row(page, "nightly")
    assert "0 9 * * *" in nightly and "Europe/Paris" in nightly and "not yet run by a keeper" in nightly


def test_a_paused_schedule_is_tagged_paused(make_dashboard: MakeDashboard, rclient: redis.Redis) -> None:
    """Issue 33 item 7: ``plaita schedules pause`` shows on the tab, and goes with ``resume``."""
    rclient.hset(schedule_key("nightly"), mapping={"cron": "0 9 * * *", "tz": "UTC", "missed": "skip"})
    rclient.sadd(SCHEDULES_KEY, "nightly")
    rclient.hset(schedule_key("nightly"), "paused", f"{time.time()!r} ann@test")
    assert 'data-paused="1"' in row(make_dashboard().get("/schedules").text, "nightly")
    rclient.hdel(schedule_key("nightly"), "paused")
    assert "data-paused" not in row(make_dashboard().get("/schedules").text, "nightly")
