"""The executions tab against real Redis and the real flow engine: lists, timeline, cancel, resume."""

from __future__ import annotations

import json
import time
from typing import Any
from urllib.parse import quote

import pytest
import redis

from plaita.dashboard.executions import LIST_ROWS, SCAN_PAGE
from plaita.store.acl import ADMIN_ACL_RULES, DASHBOARD_READ_ACL_RULES, setuser_command
from plaita.store.keyspace import DEFAULT
from tests.dashboard.conftest import SAME_ORIGIN, TOKEN, MakeDashboard, csrf_of, login, plant, sample
from tests.flows.support import Harness, start
from tests.support.ops import QUEUE
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.redis

HOSTILE_FLOW = "<script>alert('flow')</script>"
HOSTILE_ERROR = "<img src=x onerror=alert('err')>"
HOSTILE_ID = 'e/<b>&"1'


def _ids(page: str) -> list[str]:
    return [part.split('"')[0] for part in page.split('data-execution="')[1:]]


def _notice(page: str) -> str:
    return page.split('id="notice">')[1].split("</div>")[0]


def _stream_bodies(client: redis.Redis) -> list[dict[str, Any]]:
    return [json.loads(fields["payload"]) for _mid, fields in client.xrange(QUEUE)]


class TestReadPages:
    def test_the_list_filters_by_status_and_flow_newest_first(
        self, make_dashboard: MakeDashboard, rclient: redis.Redis
    ) -> None:
        now = time.time()
        plant(rclient, "a", "running", now - 30)
        plant(rclient, "b", "completed", now - 20, flow_id="f2")
        plant(rclient, "c", "error", now - 10, error={"type": "ValueError", "message": "bad card"})
        dash = make_dashboard()
        assert _ids(dash.get("/executions").text) == ["c", "b", "a"]
        errors = dash.get("/executions", params={"status": "error"}).text
        assert _ids(errors) == ["c"] and "ValueError: bad card" in errors
        assert _ids(dash.get("/executions", params={"flow": "f1"}).text) == ["c", "a"]
        assert _ids(dash.get("/executions", params={"flow": "f2", "status": "running"}).text) == []
        bad = dash.get("/executions", params={"status": "nonsense"})
        assert bad.status_code == 200 and "unknown status &#39;nonsense&#39;" in bad.text and _ids(bad.text) == []

    def test_a_flow_filter_looks_past_the_first_index_page(
        self, make_dashboard: MakeDashboard, rclient: redis.Redis
    ) -> None:
        now = time.time()
        plant(rclient, "old-f2", "completed", now - 1000, flow_id="f2")
        for n in range(SCAN_PAGE + 50):
            plant(rclient, f"new{n}", "completed", now - n)
        dash = make_dashboard()
        assert _ids(dash.get("/executions", params={"flow": "f2"}).text) == ["old-f2"]
        full = dash.get("/executions", params={"status": "completed"}).text
        assert len(_ids(full)) == LIST_ROWS and f'id="executions-count">{LIST_ROWS}+<' in full
        assert _ids(full)[0] == "new0", "newest update first"

    def test_the_overview_and_the_list_count_executions_by_status(
        self, make_dashboard: MakeDashboard, rclient: redis.Redis
    ) -> None:
        now = time.time()
        for n in range(3):
            plant(rclient, f"done{n}", "completed", now - n)
        plant(rclient, "s1", "suspended", now)
        dash = make_dashboard()
        snap = sample(dash)
        assert snap["executions"] == {
            "queued": 0,
            "running": 0,
            "suspended": 1,
            "completed": 3,
            "error": 0,
            "cancelled": 0,
        }
        live = dash.get("/fragment/overview").text
        assert 'id="executions-total">4<' in live and 'data-status="completed">3 completed<' in live
        assert 'data-status="suspended">suspended (1)<' in dash.get("/executions").text

    def test_a_step_timeline_of_a_real_execution(self, make_dashboard: MakeDashboard, h: Harness) -> None:
        doc = h.run(start("t1", "signup", name="ann"))
        assert doc is not None and doc["status"] == "suspended"
        page = make_dashboard().get("/executions/t1")
        assert page.status_code == 200 and 'id="execution-status">suspended<' in page.text
        timeline = page.text.split('id="timeline"')[1]
        assert timeline.count("<tr class=") == 2
        assert 'outcome-ok"' in timeline and "create" in timeline and 'outcome-suspended"' in timeline
        assert "wait_email" in timeline and " s</td>" in timeline  # each step's duration

    def test_a_start_no_worker_read_is_listed_and_shown_queued(self, make_dashboard: MakeDashboard, h: Harness) -> None:
        """Issue 31, item 2: before, a start was invisible until a worker read it."""
        eid = h.flows.start("signup", {"name": "ann"}, execution_id="fresh-1")
        dash = make_dashboard()
        listed = dash.get("/executions", params={"status": "queued"})
        assert listed.status_code == 200 and f'href="/executions/{eid}"' in listed.text
        page = dash.get(f"/executions/{eid}")
        assert page.status_code == 200 and 'id="execution-status">queued<' in page.text

    def test_hostile_ids_flow_ids_and_errors_render_as_text(
        self, make_dashboard: MakeDashboard, rclient: redis.Redis
    ) -> None:
        error = {"type": "RuntimeError", "step": "s", "message": HOSTILE_ERROR, "attempts": 3,
                 "traceback": f"Traceback\n{HOSTILE_ERROR}"}  # fmt: skip
        history = [{"step": "s", "attempt": 3, "started_at": 1.0, "ended_at": 2.5, "outcome": "error",
                    "error": HOSTILE_ERROR}]  # fmt: skip
        plant(rclient, HOSTILE_ID, "error", time.time(), flow_id=HOSTILE_FLOW, error=error, history=history)
        dash = make_dashboard()
        listing = dash.get("/executions").text
        detail = dash.get(f"/executions/{quote(HOSTILE_ID, safe='')}")
        assert detail.status_code == 200 and "1.500 s" in detail.text
        for page in (listing, detail.text):
            assert HOSTILE_FLOW not in page and "&lt;script&gt;alert(&#39;flow&#39;)&lt;/script&gt;" in page
            assert HOSTILE_ERROR not in page and "&lt;img src=x onerror=alert(&#39;err&#39;)&gt;" in page
            assert "<b>" not in page
        href = listing.split('data-execution="')[1].split('href="')[1].split('"')[0]
        assert "<" not in href and '"' not in href and "&" not in href, "the link is URL-encoded"
        assert dash.get(href).text == detail.text, "the list's link opens the execution"

    def test_an_unknown_id_is_404_and_an_expired_state_is_skipped_without_writing(
        self, make_dashboard: MakeDashboard, rclient: redis.Redis
    ) -> None:
        dash = make_dashboard()
        missing = dash.get("/executions/nope")
        assert missing.status_code == 404 and "No such execution" in missing.text
        rclient.zadd(DEFAULT.status_key(0, "completed"), {"expired": time.time()})
        assert _ids(dash.get("/executions").text) == []
        assert rclient.zscore(DEFAULT.status_key(0, "completed"), "expired") is not None, "reads never prune the index"


class TestActions:
    def test_resume_with_type_and_json_data_completes_the_execution(
        self, make_dashboard: MakeDashboard, rclient: redis.Redis, h: Harness
    ) -> None:
        h.run(start("r1", "signup"))
        dash = make_dashboard()
        csrf = login(dash)
        page = dash.get("/executions/r1").text
        assert 'id="resume-form"' in page and 'id="cancel"' in page
        form = {"csrf": csrf_of(page), "execution_id": "r1", "type": "event", "data": '{"email": "a@b.c"}',
                "resume_id": "dash-1"}  # fmt: skip
        assert form["csrf"] == csrf
        after = dash.post("/executions/resume", data=form, headers=SAME_ORIGIN)
        assert after.url.path == "/executions/r1" and "event resume of execution &#39;r1&#39; enqueued" in after.text
        (body,) = _stream_bodies(rclient)
        assert body["data"] == {"email": "a@b.c"} and body["resume_id"] == "dash-1"
        doc = h.run(body)
        assert doc is not None and doc["status"] == "completed"
        assert doc["state"]["email"] == {"email": "a@b.c"}
        done = dash.get("/executions/r1").text
        assert 'id="execution-status">completed<' in done and 'id="resume-form"' not in done

    def test_bad_resume_data_or_type_is_a_message_and_enqueues_nothing(
        self, make_dashboard: MakeDashboard, rclient: redis.Redis, h: Harness
    ) -> None:
        h.run(start("r2", "signup"))
        dash = make_dashboard()
        csrf = login(dash)
        bad_json = {"csrf": csrf, "execution_id": "r2", "type": "event", "data": "{nope"}
        notice = _notice(dash.post("/executions/resume", data=bad_json, headers=SAME_ORIGIN).text)
        assert "resume data is not valid JSON" in notice
        bad_type = {"csrf": csrf, "execution_id": "r2", "type": "<explode>", "data": ""}
        notice = _notice(dash.post("/executions/resume", data=bad_type, headers=SAME_ORIGIN).text)
        assert "unknown resume type &#39;&lt;explode&gt;&#39;" in notice
        unknown = {"csrf": csrf, "execution_id": "ghost", "type": "event", "data": ""}
        notice = _notice(dash.post("/executions/resume", data=unknown, headers=SAME_ORIGIN).text)
        assert "no execution &#39;ghost&#39;" in notice
        assert rclient.xlen(QUEUE) == 0

    def test_cancel_of_a_suspended_execution_ends_it_and_a_second_cancel_says_so(
        self, make_dashboard: MakeDashboard, rclient: redis.Redis, h: Harness
    ) -> None:
        h.run(start("c1", "signup"))
        dash = make_dashboard()
        csrf = login(dash)
        page = dash.post("/executions/cancel", data={"csrf": csrf, "execution_id": "c1"}, headers=SAME_ORIGIN)
        assert "cancel requested for execution &#39;c1&#39;: it stops at once" in _notice(page.text)
        assert rclient.exists(DEFAULT.cancel_key("c1")) == 1
        (body,) = _stream_bodies(rclient)
        assert body["resume_type"] == "cancel"
        doc = h.run(body)
        assert doc is not None and doc["status"] == "cancelled"
        again = dash.post("/executions/cancel", data={"csrf": csrf, "execution_id": "c1"}, headers=SAME_ORIGIN)
        assert "already ended (cancelled): nothing to cancel" in _notice(again.text)
        assert rclient.xlen(QUEUE) == 1

    def test_cancel_of_a_start_not_read_yet_is_recorded_and_it_ends_cancelled(
        self, make_dashboard: MakeDashboard, rclient: redis.Redis, h: Harness
    ) -> None:
        """Issue 29, item 4: it said "no execution" and the start then ran."""
        rclient.xadd(QUEUE, {"payload": json.dumps(start("q1", "signup")), "schema_version": "1"})
        dash = make_dashboard()
        csrf = login(dash)
        page = dash.post("/executions/cancel", data={"csrf": csrf, "execution_id": "q1"}, headers=SAME_ORIGIN)
        assert "execution q1 is queued and will end cancelled when a worker reads it" in _notice(page.text)
        (body,) = _stream_bodies(rclient)
        doc = h.run(body)
        assert doc is not None and doc["status"] == "cancelled" and doc["history"] == [], doc

    def test_actions_need_actions_enabled_a_token_csrf_and_the_same_origin(
        self, make_dashboard: MakeDashboard, rclient: redis.Redis, h: Harness
    ) -> None:
        h.run(start("g1", "signup"))
        read_only = make_dashboard(allow_actions=False)
        assert 'id="resume-form"' not in read_only.get("/executions/g1").text
        form = {"execution_id": "g1", "type": "event", "data": ""}
        r = read_only.post("/executions/resume", data=form, headers=SAME_ORIGIN)
        assert r.status_code == 403 and "read-only" in r.text
        dash = make_dashboard()
        assert 'id="resume-form"' not in dash.get("/executions/g1").text, "no buttons before logging in"
        assert dash.post("/executions/cancel", data=form, headers=SAME_ORIGIN).status_code == 403
        csrf = login(dash)
        assert dash.post("/executions/cancel", data=form, headers=SAME_ORIGIN).status_code == 403, "no CSRF token"
        forged = {**form, "csrf": csrf}
        cross = dash.post("/executions/cancel", data=forged, headers={"Origin": "http://evil.example"})
        assert cross.status_code == 403 and "cross-site" in cross.text
        assert rclient.xlen(QUEUE) == 0 and rclient.exists(DEFAULT.cancel_key("g1")) == 0
        bearer = make_dashboard().post("/executions/resume", data=form, headers={"Authorization": f"Bearer {TOKEN}"})
        assert bearer.status_code == 200 and rclient.xlen(QUEUE) == 1


class TestAcl:
    def test_the_admin_user_may_cancel_and_resume_without_a_denial(
        self, make_dashboard: MakeDashboard, redis_server: RedisServer, rclient: redis.Redis, h: Harness
    ) -> None:
        h.run(start("acl1", "signup"))
        url = acl_user(redis_server, "plaita-admin-x", ADMIN_ACL_RULES)
        dash = make_dashboard(url=url)
        assert sample(dash)["executions"]["suspended"] == 1
        bearer = {"Authorization": f"Bearer {TOKEN}"}
        assert dash.get("/executions/acl1").status_code == 200
        resumed = dash.post("/executions/resume", data={"execution_id": "acl1", "type": "continue"}, headers=bearer)
        assert "continue resume of execution" in _notice(resumed.text)
        cancelled = dash.post("/executions/cancel", data={"execution_id": "acl1"}, headers=bearer)
        assert "cancel requested" in _notice(cancelled.text) and rclient.xlen(QUEUE) == 2
        assert [e for e in rclient.acl_log() if e.get("reason") != "auth"] == []

    def test_a_read_user_from_before_the_executions_tab_still_sees_the_fleet(
        self, make_dashboard: MakeDashboard, redis_server: RedisServer, rclient: redis.Redis
    ) -> None:
        old_rules = DASHBOARD_READ_ACL_RULES.replace(" +get +zrevrange +zcard", "")
        assert old_rules != DASHBOARD_READ_ACL_RULES
        plant(rclient, "x1", "running", time.time())
        dash = make_dashboard(url=acl_user(redis_server, "plaita-dash-old", old_rules), allow_actions=False)
        snap = sample(dash)
        assert snap["redis"]["ok"] is True and snap["executions"] is None, "no outage for a missing permission"
        assert 'id="executions-total">-<' in dash.get("/fragment/overview").text
        page = dash.get("/executions")
        assert page.status_code == 200 and 'id="page-error"' in page.text and "no permissions" in page.text


def acl_user(server: RedisServer, user: str, rules: str) -> str:
    """A Redis user with ``rules`` (deleted with the server); its URL, with the password."""
    admin = server.client(decode_responses=True)
    admin.execute_command(*setuser_command(user, "pw-0123456789", rules))
    admin.execute_command("ACL", "LOG", "RESET")
    admin.close()
    return f"redis://{user}:pw-0123456789@127.0.0.1:{server.port}/0"


class TestTenants:
    def test_the_tenant_filter_lists_reads_and_steers_that_tenants_executions(
        self, make_dashboard: MakeDashboard, rclient: redis.Redis, h: Harness
    ) -> None:
        h.run(start("same", "signup"))
        h.run({**start("same", "signup", name="tia"), "tenant_id": "t1"})
        h.run({**start("only", "ledger3"), "tenant_id": "t1"})
        dash = make_dashboard()
        assert _ids(dash.get("/executions").text) == ["same"]
        listed = dash.get("/executions", params={"tenant": "t1"}).text
        assert _ids(listed) == ["only", "same"] and 'href="/executions/same?tenant=t1"' in listed
        assert _ids(dash.get("/executions", params={"tenant": "t1", "status": "completed"}).text) == ["only"]
        bad = dash.get("/executions", params={"tenant": "a:b"})
        assert bad.status_code == 200 and "invalid tenant_id" in bad.text and _ids(bad.text) == []
        page = dash.get("/executions/same", params={"tenant": "t1"}).text
        assert 'id="execution-tenant">t1<' in page and "tia" in page
        assert dash.get("/executions/only").status_code == 404  # not the default tenant's
        csrf = login(dash)
        form = {"csrf": csrf, "execution_id": "same", "tenant": "t1"}
        after = dash.post("/executions/cancel", data=form, headers=SAME_ORIGIN)
        assert after.url.path == "/executions/same" and "tenant=t1" in str(after.url)
        (body,) = _stream_bodies(rclient)
        assert (body["resume_type"], body["tenant_id"]) == ("cancel", "t1")
        assert rclient.exists("plaita:t1:execution:cancel:same") == 1
        assert rclient.exists(DEFAULT.cancel_key("same")) == 0
        doc = h.run(body)
        assert doc is not None and doc["status"] == "cancelled"
        assert 'id="execution-status">suspended<' in dash.get("/executions/same").text  # the default's: untouched

    def test_the_overview_counts_each_tenants_executions(self, make_dashboard: MakeDashboard, h: Harness) -> None:
        h.run(start("d1", "ledger3"))
        h.run({**start("a1", "ledger3"), "tenant_id": "t1"})
        h.run({**start("a2", "signup"), "tenant_id": "t1"})
        dash = make_dashboard()
        snap = sample(dash)
        assert snap["executions"]["completed"] == 1, "the default tenant's own counts, as before"
        assert snap["tenant_executions"]["tenants"]["t1"]["completed"] == 1
        assert snap["tenant_executions"]["tenants"]["t1"]["suspended"] == 1
        live = dash.get("/fragment/overview").text
        row = live.split('data-tenant="t1"', 1)[1].split("</tr>", 1)[0]
        assert "<td>2</td>" in row and 'href="/executions?status=suspended&amp;tenant=t1">1 suspended<' in row
