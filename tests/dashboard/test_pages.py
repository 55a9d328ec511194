"""Every page renders what Redis holds, escaped; read-only mode and the action guard hold."""

from __future__ import annotations

import re

import pytest
import redis

from plaita.dashboard.security import SESSION_COOKIE
from tests.dashboard.conftest import SAME_ORIGIN, TOKEN, MakeDashboard, dead_letter, login, register, sample
from tests.support.ops import DLQ, QUEUE, enqueue, task

pytestmark = pytest.mark.redis

XSS = "<script>alert(1)</script>"


class TestReadPages:
    def test_overview_shows_workers_and_queue_and_the_workers_tab_each_worker_on_the_diagram(
        self, make_dashboard: MakeDashboard, rclient: redis.Redis
    ) -> None:
        register(rclient, "w-reading")
        register(rclient, "w-backoff", state="BACKOFF", ready=False, ready_reason="redis transient failure: boom")
        rclient.xgroup_create(QUEUE, "plaita-workers", id="0", mkstream=True)
        for n in range(3):
            enqueue(rclient, task(n))
        dead_letter(rclient, reason="boom", payload={"type": "start"})
        dash = make_dashboard(allow_actions=False)
        sample(dash)
        page = dash.get("/")
        assert page.status_code == 200
        html = page.text
        assert html.index('id="flows"') < html.index('id="queue"'), "the overview leads with the flows"
        assert "data-state=" not in html, "the lifecycle diagram lives on the Workers tab"
        workers = dash.get("/workers").text
        assert 'data-state="READING" data-count="1"' in workers and 'data-state="BACKOFF" data-count="1"' in workers
        assert 'data-state="PAUSED" data-count="0"' in workers
        assert re.search(r'id="stat-length">3<', html) and re.search(r'id="stat-lag">3<', html)
        assert re.search(r'id="dlq-length">1<', html)
        row = html.split('data-instance="w-backoff"')[1].split("</tr>")[0]
        assert "BACKOFF" in row and "42s" in row and "redis transient failure: boom" in row
        assert 'id="live" data-refresh="/fragment/overview"' in html, "the overview refreshes itself"
        assert 'src="/static/dashboard.js"' in html and dash.get("/static/dashboard.js").status_code == 200

    def test_fragment_and_json_carry_the_same_picture(
        self, make_dashboard: MakeDashboard, rclient: redis.Redis
    ) -> None:
        register(rclient, "w1", state="PAUSED")
        dash = make_dashboard(allow_actions=False)
        sample(dash)
        fragment = dash.get("/fragment/overview").text
        assert "<html" not in fragment and 'data-instance="w1"' in fragment and "PAUSED" in fragment
        data = dash.get("/api/overview").json()
        assert data["redis"]["ok"] is True and data["by_state"] == {"PAUSED": ["w1"]}
        assert data["workers"][0]["state"] == "PAUSED" and data["stats"]["dlq_length"] == 0

    def test_before_the_first_sample_the_page_says_it_is_connecting(self, make_dashboard: MakeDashboard) -> None:
        dash = make_dashboard(allow_actions=False)
        assert 'id="connecting"' in dash.get("/").text

    def test_dlq_list_and_entry_show_reason_deliveries_age(
        self, make_dashboard: MakeDashboard, rclient: redis.Redis
    ) -> None:
        dlq_id = dead_letter(rclient, reason="handler failed: boom 7", payload={"type": "start", "n": 7}, deliveries=5)
        dash = make_dashboard(allow_actions=False)
        listing = dash.get("/dlq").text
        row = listing.split(f'data-dlq-id="{dlq_id}"')[1].split("</tr>")[0]
        assert "handler failed: boom 7" in row and "<td>5</td>" in row and "90s" in row
        assert 'id="dlq-count">1<' in listing
        entry = dash.get(f"/dlq/entry/{dlq_id}")
        assert entry.status_code == 200 and "handler failed: boom 7" in entry.text and "&#34;n&#34;: 7" in entry.text
        assert dash.get("/dlq/entry/1-1").status_code == 404
        assert dash.get("/dlq/entry/not-an-id").status_code == 404

    def test_dlq_filter_lists_only_matching_entries(self, make_dashboard: MakeDashboard, rclient: redis.Redis) -> None:
        a = dead_letter(rclient, reason="timeout talking to billing", payload={"x": 1})
        b = dead_letter(rclient, reason="bad JSON", payload="{oops")
        dash = make_dashboard(allow_actions=False)
        page = dash.get("/dlq", params={"q": "billing"}).text
        assert f'data-dlq-id="{a}"' in page and f'data-dlq-id="{b}"' not in page
        assert f'Looked at 2 dead letter(s), <span class="mono">{a}</span> to' in page  # the range it searched

    def test_a_partitioned_dlq_lists_and_shows_partition_qualified_ids(
        self, make_dashboard: MakeDashboard, redis_url: str
    ) -> None:
        from plaita.config import Settings
        from plaita.store.streams.entries import DeadLetter
        from plaita.store.streams.partitioned import open_queue

        q = open_queue(Settings(redis_url=redis_url, queue_name=QUEUE, consumer_name="c", partitions=3))
        q.ensure_group()
        q.enqueue_many([{"type": "start", "execution_id": f"d{i}", "params": {}} for i in range(6)])
        entries = q.read_new(6, 100) + q.read_new(6, 100)
        q.settle([], [DeadLetter(e.message_id, "boom partitioned", 1, {"n": 1}, e.fields) for e in entries])
        dash = make_dashboard(allow_actions=False, partitions=3)
        listing = dash.get("/dlq").text
        ids = re.findall(r'data-dlq-id="(\d/[0-9-]+)"', listing)
        assert len(ids) == 6 and {i[0] for i in ids} == {"0", "1", "2"}
        entry = dash.get(f"/dlq/entry/{ids[0]}")
        assert entry.status_code == 200 and "boom partitioned" in entry.text
        assert dash.get("/dlq/entry/7/1-0").status_code == 404
        q.close()


class TestEscaping:
    def test_script_payload_reason_and_worker_fields_render_as_text(
        self, make_dashboard: MakeDashboard, rclient: redis.Redis
    ) -> None:
        dlq_id = dead_letter(rclient, reason=f"reason {XSS}", payload=XSS)
        evil_id = '<img src=x onerror="alert(2)">'
        register(rclient, evil_id, last_error=XSS, ready=False, ready_reason=XSS, host=XSS, state="BACKOFF")
        dash = make_dashboard()
        sample(dash)
        pages = [dash.get(p).text for p in ("/", "/fragment/overview", "/workers", "/dlq", f"/dlq/entry/{dlq_id}")]
        for html in pages:
            assert XSS not in html and "<img src=x" not in html
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in pages[3] and "&lt;script&gt;" in pages[4]
        assert "&lt;img src=x onerror=" in pages[0], "the instance id is shown, escaped, in the table and diagram"
        assert "alert(1)" in dash.get("/api/overview").text  # JSON carries the raw text; browsers get it as data

    def test_every_response_forbids_inline_scripts_and_framing(self, make_dashboard: MakeDashboard) -> None:
        dash = make_dashboard(allow_actions=False)
        for path in ("/", "/dlq", "/login", "/api/overview"):
            headers = dash.get(path).headers
            assert "script-src 'self'" in headers["content-security-policy"]
            assert "frame-ancestors 'none'" in headers["content-security-policy"]
            assert headers["x-content-type-options"] == "nosniff"

    def test_a_foreign_host_header_is_refused(self, make_dashboard: MakeDashboard) -> None:
        """A DNS-rebinding page reaches the loopback port under its own name: refused."""
        dash = make_dashboard(allow_actions=False)
        assert dash.get("/", headers={"Host": "evil.example"}).status_code == 400


class TestGuard:
    def test_read_only_dashboard_refuses_every_action_and_shows_no_buttons(
        self, make_dashboard: MakeDashboard, rclient: redis.Redis
    ) -> None:
        dlq_id = dead_letter(rclient, reason="r", payload={"a": 1})
        register(rclient, "w1")
        dash = make_dashboard(allow_actions=False)
        sample(dash)
        assert 'data-action="requeue"' not in dash.get("/dlq").text
        assert 'data-action="pause"' not in dash.get("/workers").text
        assert "read-only" in dash.get("/login").text
        assert dash.post("/login", data={"token": TOKEN}, headers=SAME_ORIGIN).status_code == 403
        refused = dash.post("/dlq/requeue", data={"id": dlq_id}, headers={**SAME_ORIGIN, "Authorization": "x"})
        assert refused.status_code == 403 and "--allow-actions" in refused.text
        assert dash.post("/dlq/purge", data={"confirm": "yes", "expected": "1"}, headers=SAME_ORIGIN).status_code == 403
        assert rclient.xlen(DLQ) == 1

    def test_actions_need_the_token(self, make_dashboard: MakeDashboard, rclient: redis.Redis) -> None:
        dlq_id = dead_letter(rclient, reason="r", payload={"a": 1})
        dash = make_dashboard()
        assert dash.post("/dlq/requeue", data={"id": dlq_id}, headers=SAME_ORIGIN).status_code == 403
        wrong = dash.post("/login", data={"token": "wrong-token-xxxxxxxx"}, headers=SAME_ORIGIN)
        assert wrong.status_code == 403 and 'id="login-failed"' in wrong.text and "set-cookie" not in wrong.headers
        bad_bearer = {"Authorization": "Bearer wrong-token-xxxxxxxx"}
        assert dash.post("/dlq/requeue", data={"id": dlq_id}, headers=bad_bearer).status_code == 403
        assert rclient.xlen(DLQ) == 1
        ok = dash.post("/dlq/requeue", data={"id": dlq_id}, headers={"Authorization": f"Bearer {TOKEN}"})
        assert ok.status_code == 200 and "requeued 1 dead letter" in ok.text
        assert rclient.xlen(DLQ) == 0 and rclient.xlen(QUEUE) == 1

    def test_session_cookie_is_httponly_and_samesite_strict(self, make_dashboard: MakeDashboard) -> None:
        dash = make_dashboard()
        r = dash.post("/login", data={"token": TOKEN}, headers=SAME_ORIGIN, follow_redirects=False)
        cookie = r.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie and TOKEN.lower() not in cookie

    @pytest.mark.parametrize(
        ("headers", "form_csrf"),
        [
            pytest.param({"Origin": "http://evil.example"}, True, id="foreign-origin"),
            pytest.param({"Origin": "http://testserver:9999"}, True, id="other-port-origin"),
            pytest.param({"Referer": "http://evil.example/page"}, True, id="foreign-referer"),
            pytest.param({"Sec-Fetch-Site": "cross-site", **SAME_ORIGIN}, True, id="sec-fetch-cross-site"),
            pytest.param({}, True, id="no-origin-no-referer"),
            pytest.param(SAME_ORIGIN, False, id="no-csrf-token"),
        ],
    )
    def test_cross_site_and_tokenless_posts_are_refused(
        self, make_dashboard: MakeDashboard, rclient: redis.Redis, headers: dict[str, str], form_csrf: bool
    ) -> None:
        dlq_id = dead_letter(rclient, reason="r", payload={"a": 1})
        dash = make_dashboard()
        csrf = login(dash)
        data = {"id": dlq_id, **({"csrf": csrf} if form_csrf else {})}
        r = dash.post("/dlq/requeue", data=data, headers=headers, follow_redirects=False)
        assert r.status_code == 403, r.text
        assert rclient.xlen(DLQ) == 1, "nothing was requeued"

    def test_a_wrong_csrf_token_is_refused_and_the_right_one_accepted(
        self, make_dashboard: MakeDashboard, rclient: redis.Redis
    ) -> None:
        dlq_id = dead_letter(rclient, reason="r", payload={"a": 1})
        dash = make_dashboard()
        csrf = login(dash)
        wrong = dash.post("/dlq/requeue", data={"id": dlq_id, "csrf": csrf[::-1]}, headers=SAME_ORIGIN)
        assert wrong.status_code == 403 and rclient.xlen(DLQ) == 1
        same_site = {"Referer": "http://testserver/dlq"}
        ok = dash.post("/dlq/requeue", data={"id": dlq_id, "csrf": csrf}, headers=same_site, follow_redirects=False)
        assert ok.status_code == 303 and ok.headers["location"].startswith("/dlq?notice=")
        assert rclient.xlen(DLQ) == 0

    def test_logout_ends_the_session_even_if_the_old_cookie_is_replayed(
        self, make_dashboard: MakeDashboard, rclient: redis.Redis
    ) -> None:
        dlq_id = dead_letter(rclient, reason="r", payload={"a": 1})
        dash = make_dashboard()
        csrf = login(dash)
        old_cookie = dash.cookies[SESSION_COOKIE]
        assert dash.post("/logout", headers=SAME_ORIGIN).status_code == 200
        dash.cookies.set(SESSION_COOKIE, old_cookie)
        assert dash.post("/dlq/requeue", data={"id": dlq_id, "csrf": csrf}, headers=SAME_ORIGIN).status_code == 403
        assert rclient.xlen(DLQ) == 1
        assert login(dash) != csrf, "a new session gets a new CSRF token"
