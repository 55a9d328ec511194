"""The executions tab for composed flows, against real Redis and the real flow engine: a parent's
children (paged) and a child's parent, sleeps and what a suspension waits for, the schedules tab."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest
import redis

from plaita.dashboard.lineage import CHILD_ROWS
from plaita.ops.keeper_build import build_scheduler
from plaita.store.acl import DASHBOARD_READ_ACL_RULES
from plaita.store.executions.schedule_store import SCHEDULES_KEY, schedule_key
from plaita.store.keyspace import DEFAULT
from plaita.store.streams.queue import StreamQueue
from tests.dashboard.conftest import MakeDashboard, plant
from tests.dashboard.test_executions import HOSTILE_FLOW, acl_user
from tests.flows import fanout_flows, scheduled, sleepdefs
from tests.flows.support import Harness, start
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.redis


@pytest.fixture
def h(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    """The real flow engine over the fan-out, sleep and schedule test flows, fed tasks by hand."""
    monkeypatch.setenv("PLAITA_TEST_REDIS_URL", redis_url)
    h = Harness(redis_url, flows=[*fanout_flows.FLOWS, *sleepdefs.FLOWS, scheduled.every_second])
    try:
        yield h
    finally:
        h.close()


def _take_tasks(client: redis.Redis) -> list[dict[str, Any]]:
    """The task bodies the engine enqueued (child starts, the parent's resume), removed from the stream."""
    stream = DEFAULT.stream(0)
    entries = client.xrange(stream)
    if entries:
        client.xdel(stream, *[mid for mid, _ in entries])
    return [json.loads(fields.get("payload") or fields[b"payload"]) for _mid, fields in entries]


def _children(page: str) -> dict[str, str]:
    return dict(re.findall(r'data-child="([^"]+)" data-child-status="([^"]+)"', page))


def _path(eid: str) -> str:
    return f"/executions/{quote(eid, safe='')}"


class TestParentsAndChildren:
    def test_a_parent_lists_its_children_with_their_status_and_each_child_links_back(
        self, make_dashboard: MakeDashboard, rclient: redis.Redis, h: Harness
    ) -> None:
        assert (h.run(start("p1", "fan", n=3)) or {})["status"] == "suspended"
        dash = make_dashboard()
        kids = [f"p1:spread:0:{i}" for i in range(3)]
        waiting = dash.get("/executions/p1").text
        assert 'data-kind="children"' in waiting and "waiting on 3 child execution(s) of kid" in waiting
        assert _children(waiting) == dict.fromkeys(kids, "not started")
        assert "waiting on these" in waiting
        starts = _take_tasks(rclient)
        assert [b["execution_id"] for b in starts] == kids
        h.run(starts[0])
        assert _children(dash.get("/executions/p1").text) == {
            kids[0]: "completed",
            **dict.fromkeys(kids[1:], "not started"),
        }
        child = dash.get(_path(kids[0])).text
        assert 'id="parent-link" href="/executions/p1"' in child and "(child 0 of 3)" in child
        for body in starts[1:]:
            h.run(body)
        (resume,) = _take_tasks(rclient)
        assert (h.run(resume) or {})["status"] == "completed"
        joined = dash.get("/executions/p1").text
        assert 'id="waiting"' not in joined and "joined" in joined
        assert _children(joined) == dict.fromkeys(kids, "completed"), "the count comes from a child's link"
        assert 'data-status="completed">3 completed<' in joined

    def test_hundreds_of_children_are_listed_a_page_at_a_time(
        self, make_dashboard: MakeDashboard, rclient: redis.Redis
    ) -> None:
        now = time.time()
        n = 2 * CHILD_ROWS + 20
        waiting = {"flow_id": "kid", "prefix": "big:spread:1", "count": n}
        plant(rclient, "big", "suspended", now, suspension={"seq": 2, "step": "spread", "since": now,
              "deadline": None, "children": waiting}, children={"spread": 1})  # fmt: skip
        for i in range(n - 1):  # the last one not started yet
            link = {"id": "big", "flow_id": "fan", "prefix": "big:spread:1", "count": n, "index": i}
            plant(rclient, f"big:spread:1:{i}", "completed" if i % 2 else "running", now, parent=link)
        for i in range(CHILD_ROWS + 5):  # an earlier spawn, joined: its count is read from a child
            link = {"id": "big", "prefix": "big:spread:0", "count": CHILD_ROWS + 5, "index": i}
            plant(rclient, f"big:spread:0:{i}", "completed", now - 100, parent=link)
        dash = make_dashboard()
        first = dash.get("/executions/big").text
        assert len(_children(first)) == CHILD_ROWS and 'id="children-next"' in first
        assert 'id="children-prev"' not in first
        assert f"of {n}" in first and f"{CHILD_ROWS // 2} completed" in first
        last = dash.get("/executions/big", params={"spawn": "big:spread:1", "children_from": 2 * CHILD_ROWS}).text
        rows = _children(last)
        assert len(rows) == 20 and rows[f"big:spread:1:{n - 1}"] == "not started"
        assert 'id="children-next"' not in last and 'id="children-prev"' in last
        joined = dash.get("/executions/big", params={"spawn": "big:spread:0"}).text
        assert len(_children(joined)) == CHILD_ROWS and 'id="children-next"' in joined
        assert all(k.startswith("big:spread:0:") for k in _children(joined))
        rest = dash.get("/executions/big", params={"spawn": "big:spread:0", "children_from": CHILD_ROWS}).text
        assert len(_children(rest)) == 5 and 'id="children-next"' not in rest
        stranger = dash.get("/executions/big", params={"spawn": "other:spread:0"}).text
        assert all(k.startswith("big:spread:1:") for k in _children(stranger)), "only its own spawns are read"

    def test_a_hostile_parent_id_renders_as_text_in_an_encoded_link(
        self, make_dashboard: MakeDashboard, rclient: redis.Redis
    ) -> None:
        parent = '<b>"p"</b>&'
        plant(rclient, "hk", "running", time.time(), parent={"id": parent, "flow_id": HOSTILE_FLOW, "index": 0})
        page = make_dashboard().get("/executions/hk").text
        assert "<b>" not in page and "&lt;b&gt;&#34;p&#34;&lt;/b&gt;&amp;" in page
        href = page.split('id="parent-link" href="')[1].split('"')[0]
        assert "<" not in href and '"' not in href and "&" not in href

    def test_an_unreadable_execution_or_child_is_named_not_a_crash(
        self, make_dashboard: MakeDashboard, rclient: redis.Redis
    ) -> None:
        now = time.time()
        waiting = {"flow_id": "kid", "prefix": "pu:s:0", "count": 2}
        plant(rclient, "pu", "suspended", now, suspension={"seq": 1, "step": "s", "children": waiting})
        rclient.set(DEFAULT.execution_key("pu:s:0:1"), "not json")
        dash = make_dashboard()
        page = dash.get("/executions/pu").text
        assert _children(page) == {"pu:s:0:0": "not started", "pu:s:0:1": "unreadable"}
        rclient.set(DEFAULT.execution_key("junk"), "[1, 2]")
        junk = dash.get("/executions/junk")
        assert junk.status_code == 200 and "Unreadable execution" in junk.text and "plaita:execution:junk" in junk.text
        assert rclient.get(DEFAULT.execution_key("junk")) == "[1, 2]", "left as it was"


class TestWaiting:
    def test_a_durable_sleep_shows_until_when_and_the_list_filters_what_suspensions_wait_for(
        self, make_dashboard: MakeDashboard, rclient: redis.Redis, h: Harness
    ) -> None:
        until_s = time.time() + 3 * 86400
        assert (h.run(start("nap1", "napper", until_s=until_s)) or {})["status"] == "suspended"
        h.run(start("fan1", "fan", n=2))
        plant(rclient, "ev1", "suspended", time.time(), suspension={"seq": 1, "step": "s", "since": time.time(),
              "deadline": time.time() + 60})  # fmt: skip
        dash = make_dashboard()
        page = dash.get("/executions/nap1").text
        stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(until_s))
        assert 'data-kind="sleep"' in page and f"sleeping until {stamp} (in 72.0h)" in page
        listed = dash.get("/executions").text
        assert f"sleeping until {stamp}" in listed and "waiting on 2 child execution(s)" in listed
        assert "waiting for a resume, timeout at" in listed

        def ids(**params: str) -> list[str]:
            text = dash.get("/executions", params=params).text
            return [part.split('"')[0] for part in text.split('data-execution="')[1:]]

        assert ids(waiting="sleep") == ["nap1"]
        assert ids(waiting="children") == ["fan1"]
        assert ids(waiting="resume") == ["ev1"]
        assert ids(waiting="sleep", flow="fan") == []
        bad = dash.get("/executions", params={"waiting": "<x>"}).text
        assert "unknown waiting filter &#39;&lt;x&gt;&#39;" in bad
        mixed = dash.get("/executions", params={"waiting": "sleep", "status": "running"}).text
        assert "only suspended executions wait" in mixed


class TestSchedules:
    def test_the_tab_lists_each_schedule_with_its_next_tick_and_last_execution(
        self, make_dashboard: MakeDashboard, rclient: redis.Redis, h: Harness
    ) -> None:
        dash = make_dashboard()
        assert "no schedule recorded" in dash.get("/schedules").text
        queue = StreamQueue(h.client, stream=DEFAULT.stream(0), group="g", consumer="c", dlq_key="d", dlq_max_len=1)
        # It records the schedule and starts its on-time ticks.
        report = build_scheduler([scheduled.every_second], queue).run_pass(time.time())
        assert report.started, "a tick was due"
        rclient.hset(schedule_key(HOSTILE_FLOW), mapping={"cron": "0 9 * * *", "tz": "Europe/Paris", "missed": "skip"})
        rclient.sadd(SCHEDULES_KEY, HOSTILE_FLOW)
        page = dash.get("/schedules").text
        row = page.split('data-schedule="every-second"')[1].split("</tr>")[0]
        assert "* * * * * *" in row and "UTC" in row and "all (at most 100)" in row
        last = report.started[-1]
        # Recorded queued by its start (issue 31, item 2), not taken by a worker yet.
        assert f'href="/executions/{quote(last, safe="/")}"' in row and 'data-last-status="queued"' in row
        h.run(next(b for b in _take_tasks(rclient) if b["execution_id"] == last))
        row = dash.get("/schedules").text.split('data-schedule="every-second"')[1].split("</tr>")[0]
        assert 'data-last-status="completed"' in row
        assert HOSTILE_FLOW not in page and "Europe/Paris" in page
        tick = dash.get(_path(last)).text
        assert 'id="scheduled"' in tick and 'href="/schedules"' in tick

    def test_the_read_only_user_sees_schedules_and_children_without_a_denial(
        self, make_dashboard: MakeDashboard, redis_server: RedisServer, rclient: redis.Redis, h: Harness
    ) -> None:
        h.run(start("pa", "fan", n=2))
        queue = StreamQueue(h.client, stream=DEFAULT.stream(0), group="g", consumer="c", dlq_key="d", dlq_max_len=1)
        build_scheduler([scheduled.every_second], queue).run_pass(time.time())
        dash = make_dashboard(
            url=acl_user(redis_server, "plaita-dash-read", DASHBOARD_READ_ACL_RULES), allow_actions=False
        )
        assert 'data-schedule="every-second"' in dash.get("/schedules").text
        assert len(_children(dash.get("/executions/pa").text)) == 2
        assert "sleeping" in dash.get("/executions", params={"waiting": "sleep"}).text
        assert [e for e in rclient.acl_log() if e.get("reason") != "auth"] == []
