"""Issue 34 item 3: the overview is about flows, the list's counts agree with its rows, children
sit under their parent, and a step's timeline names the resume or message it consumed."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator

import pytest
import redis
from starlette.testclient import TestClient

from plaita.dashboard import flow_figures
from plaita.dashboard.app import DashboardConfig, create_app
from plaita.store.client import make_client
from plaita.store.keyspace import DEFAULT, Keyspace
from tests.dashboard.conftest import MakeDashboard, plant, sample
from tests.flows import msgdefs
from tests.flows.support import Harness, harness, start
from tests.ops.test_starts_waiting import park
from tests.support.ops import QUEUE
from tests.support.redis_server import free_port

pytestmark = pytest.mark.redis


def _ids(page: str) -> list[str]:
    return [part.split('"')[0] for part in page.split('data-execution="')[1:]]


def _cell(page: str, flow_id: str, figure: str) -> str:
    row = page.split(f'<tr data-flow="{flow_id}">', 1)[1].split("</tr>", 1)[0]
    cell = row.split(f'data-figure="{figure}"', 1)[1].split(">", 1)[1].split("</td>", 1)[0]
    return re.sub(r"<[^>]+>", "", cell).strip()


def _plant_in(client: redis.Redis, ks: Keyspace, eid: str, status: str, updated_at: float) -> None:
    doc = {"execution_id": eid, "flow_id": "f1", "status": status, "step": "s", "history": [],
           "created_at": updated_at - 5, "updated_at": updated_at}  # fmt: skip
    client.set(ks.execution_key(eid), json.dumps(doc))
    client.zadd(ks.status_key(0, status), {eid: updated_at})


class TestFlowFigures:
    def test_each_flow_row_counts_what_its_executions_do_now_and_in_the_last_minute(
        self, make_dashboard: MakeDashboard, rclient: redis.Redis, redis_url: str
    ) -> None:
        now = time.time()
        for n in range(2):
            plant(rclient, f"run{n}", "running", now - 1, flow_id="pay")
        plant(rclient, "zz", "suspended", now - 1, flow_id="pay", suspension={"kind": "sleep", "deadline": now + 60})
        plant(rclient, "rs", "suspended", now - 1, flow_id="pay", suspension={"step": "s", "wait_for": "ok"})
        # four completed in the last minute (1, 2, 3 and 10 s long), one long ago (5 s long)
        for n, took in enumerate((1.0, 2.0, 3.0, 10.0)):
            plant(rclient, f"done{n}", "completed", now - 2, flow_id="pay", created_at=now - 2 - took, ended_at=now - 2)
        plant(rclient, "old", "completed", now - 900, flow_id="pay", created_at=now - 905, ended_at=now - 900)
        plant(rclient, "bad", "error", now - 3, flow_id="pay", ended_at=now - 3)
        plant(rclient, "bad-old", "error", now - 600, flow_id="pay", ended_at=now - 600)
        plant(rclient, "other", "running", now - 1, flow_id="mail")
        park(redis_url, "export", 2)
        dash = make_dashboard()
        rows = {r["flow_id"]: r for r in sample(dash)["flows"]["flows"]}
        pay = rows["pay"]
        assert (pay["running"], pay["waiting"]) == (2, {"sleep": 1, "children": 0, "resume": 1})
        assert (pay["completed"], pay["failed"]) == (4, 1), "only the last minute's ends are per minute"
        assert (pay["p50_s"], pay["p95_s"], pay["durations"]) == (3.0, 10.0, 5)
        # created in the last minute: the 4 running/suspended (created 6 s ago), done0..3 and bad
        assert pay["started"] == 4 + 4 + 1
        assert rows["mail"]["running"] == 1 and rows["export"]["waiting_slot"] == 2
        live = dash.get("/fragment/overview").text
        assert live.index('id="flow-figures"') < live.index('id="queue"'), "flows lead the overview"
        expected = {"running": "2", "waiting-sleep": "1", "waiting-resume": "1", "completed": "4", "failed": "1"}
        assert {k: _cell(live, "pay", k) for k in expected} == expected
        assert _cell(live, "pay", "p50") == "3.0 s" and _cell(live, "pay", "p95") == "10.0 s"
        assert _cell(live, "export", "waiting-slot") == "2"
        assert 'href="/executions?waiting=sleep&amp;flow=pay"' in live

    def test_a_status_holding_more_than_one_read_is_marked_a_lower_bound(
        self, make_dashboard: MakeDashboard, rclient: redis.Redis, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr(flow_figures, "READ_PER_STATUS", 3)
        now = time.time()
        for n in range(5):
            plant(rclient, f"r{n}", "running", now - n)
        dash = make_dashboard()
        figures = sample(dash)["flows"]
        assert figures["capped"] == ["running"] and figures["flows"][0]["running"] == 3
        assert 'id="flows-capped"' in dash.get("/fragment/overview").text

    def test_a_failed_figures_read_is_said_and_never_taken_for_an_outage(self, redis_url: str) -> None:
        """The figures read hundreds of states on the pages' client: its failure (here: the pages'
        server is gone) is a note on the flows, while the fleet's sample still says Redis answers."""
        config = DashboardConfig(
            redis_url=f"redis://127.0.0.1:{free_port()}/0", queue_name=QUEUE, allowed_hosts=("testserver",)
        )
        sampler = make_client(redis_url, socket_timeout_s=5.0)
        with TestClient(create_app(config, start_monitor=False, sampler_client=sampler)) as dash:
            snap = sample(dash)
            assert snap["redis"]["ok"] is True and snap["flows"] is None
            assert "ConnectionError" in str(snap["flows_error"])
            live = dash.get("/fragment/overview").text
            assert 'id="flows-stale"' in live and 'id="outage"' not in live

    def test_percentiles_are_nearest_rank(self) -> None:
        assert flow_figures.percentile([], 50) is None
        assert flow_figures.percentile([4.0], 95) == 4.0
        values = [float(n) for n in range(1, 101)]
        assert (flow_figures.percentile(values, 50), flow_figures.percentile(values, 95)) == (50.0, 95.0)


class TestListing:
    def test_a_tenant_filter_counts_that_tenants_executions_as_its_rows_list_them(
        self, make_dashboard: MakeDashboard, rclient: redis.Redis
    ) -> None:
        """Before: ``suspended (0)`` (the default tenant's count) above six suspended rows of t1."""
        t1 = DEFAULT.for_tenant("t1")
        now = time.time()
        for n in range(6):
            _plant_in(rclient, t1, f"s{n}", "suspended", now - n)
        _plant_in(rclient, t1, "c0", "completed", now)
        for n in range(3):
            plant(rclient, f"d{n}", "completed", now)
        dash = make_dashboard()
        sample(dash)
        for status, expected in (("suspended", 6), ("completed", 1), ("running", 0)):
            page = dash.get("/executions", params={"tenant": "t1", "status": status}).text
            assert len(_ids(page)) == expected
            assert f'data-status="{status}">{status} ({expected})<' in page
        default = dash.get("/executions", params={"status": "completed"}).text
        assert len(_ids(default)) == 3 and 'data-status="completed">completed (3)<' in default
        by_flow = dash.get("/executions", params={"tenant": "t1", "flow": "f1"}).text
        assert len(_ids(by_flow)) == 7 and "suspended (" not in by_flow, "no count that is not the filter's"

    def test_children_are_grouped_under_their_parent_not_mixed_in_the_list(
        self, make_dashboard: MakeDashboard, rclient: redis.Redis
    ) -> None:
        now = time.time()
        plant(rclient, "p", "suspended", now - 50, flow_id="fan")
        plant(rclient, "x", "completed", now - 20)
        for i in range(25):
            link = {"id": "p", "flow_id": "fan", "index": i, "count": 25}
            status = "completed" if i % 5 else "running"
            plant(rclient, f"p:s:{i}", status, now - 40 + i, flow_id="leaf", parent=link)
        for i in range(2):  # children of a parent that is not listed (expired, or filtered out)
            plant(rclient, f"q:s:{i}", "completed", now - 10, flow_id="leaf", parent={"id": "q", "index": i})
        dash = make_dashboard()
        page = dash.get("/executions").text
        # p's newest child (16 s ago) is newer than x (20 s): the group sits there, p with it
        assert _ids(page) == ["p", "x"], "only executions that are no child are rows of their own"
        group = page.split('data-execution="p"', 1)[1].split("</tr>", 1)[1].split("</tr>", 1)[0]
        assert 'data-children-of="p"' in group and "25 child execution(s)" in group
        assert '<span data-status="completed">20 completed</span>' in group and "5 running" in group
        assert group.count("data-child=") == 20 and "… 5 more" in group
        assert 'href="/executions/p#children"' in group
        orphans = page.split('data-children-of="q"', 1)[1].split("</tr>", 1)[0]
        assert "the parent is not in this list" in orphans and orphans.count("data-child=") == 2
        assert page.index('data-children-of="q"') < page.index('data-execution="p"'), "at its newest member"


@pytest.fixture
def h(redis_url: str) -> Iterator[Harness]:
    with harness(redis_url, flows=msgdefs.FLOWS) as opened:
        yield opened


def test_a_steps_timeline_names_the_message_and_the_resume_it_consumed(
    make_dashboard: MakeDashboard, h: Harness
) -> None:
    seen: list[str] = []
    h.run(start("m1", "msg-inbox", gate=True))
    h.flows.send("m1", "t", {"n": 1}, idempotency_key="first")  # kept: the execution waits for "go"
    h.flows.resume("m1", "event", {"go": 1}, resume_id="go-1", wait_for="go")
    doc = h.deliver(seen)
    assert doc is not None and doc["state"]["got"] == [{"n": 1}]
    timeline = make_dashboard().get("/executions/m1").text.split('id="timeline"')[1]
    rows = timeline.split("<tr class=")[1:]
    gate_run = next(r for r in rows if "consumed" in r and ">gate<" in r)
    assert 'data-consumed="go-1"' in gate_run and "for <span" in gate_run and ">go<" in gate_run
    collect_run = next(r for r in rows if "consumed" in r and ">collect<" in r)
    assert 'data-consumed="msg:t:first"' in collect_run and ">t<" in collect_run
    assert sum("data-consumed=" in r for r in rows) == 2, "only the runs a resume woke"
