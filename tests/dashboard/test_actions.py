"""The dashboard's buttons against real Redis and a real worker: control replies, requeue, purge;
an execution's fork and delete against the real flow engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis

from plaita.store.acl import ADMIN_ACL_RULES, FLOW_ADMIN_ACL_RULES
from tests.dashboard.conftest import SAME_ORIGIN, TOKEN, MakeDashboard, dead_letter, login, sample
from tests.dashboard.test_executions import acl_user
from tests.flows.support import Harness, start
from tests.support.ops import DLQ, QUEUE, ops_worker, wait_until
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.redis


def _notice(page: str) -> str:
    return page.split('id="notice">')[1].split("</div>")[0]


class TestDlqActions:
    def test_requeue_one_puts_the_body_back_on_the_stream(
        self, make_dashboard: MakeDashboard, rclient: redis.Redis
    ) -> None:
        keep = dead_letter(rclient, reason="other", payload={"type": "start", "n": 2})
        dlq_id = dead_letter(rclient, reason="boom", payload={"type": "start", "n": 1})
        dash = make_dashboard()
        csrf = login(dash)
        page = dash.post("/dlq/requeue", data={"id": dlq_id, "csrf": csrf}, headers=SAME_ORIGIN).text
        assert "requeued 1 dead letter(s)" in _notice(page)
        assert [e[0] for e in rclient.xrange(DLQ)] == [keep]
        ((_mid, fields),) = rclient.xrange(QUEUE)
        assert json.loads(fields["payload"]) == {"type": "start", "n": 1}
        assert 'id="dlq-count">1<' in page, "the page after the redirect shows the new count"

    def test_requeue_all_matching_moves_only_the_matches(
        self, make_dashboard: MakeDashboard, rclient: redis.Redis
    ) -> None:
        hits = [dead_letter(rclient, reason=f"billing timeout {n}", payload={"n": n}) for n in range(3)]
        miss = dead_letter(rclient, reason="bad JSON", payload="{x")
        dash = make_dashboard()
        csrf = login(dash)
        listing = dash.get("/dlq", params={"q": "billing"}).text
        assert 'id="requeue-matching"' in listing and "requeue all 3 matching" in listing
        data = {"all_matching": "1", "q": "billing", "csrf": csrf}
        page = dash.post("/dlq/requeue", data=data, headers=SAME_ORIGIN).text
        assert "requeued 3 dead letter(s)" in _notice(page)
        assert [e[0] for e in rclient.xrange(DLQ)] == [miss] and rclient.xlen(QUEUE) == len(hits)

    def test_requeue_of_an_unknown_or_malformed_id_is_a_message_and_moves_nothing(
        self, make_dashboard: MakeDashboard, rclient: redis.Redis
    ) -> None:
        dead_letter(rclient, reason="r", payload={"a": 1})
        dash = make_dashboard()
        csrf = login(dash)
        gone = dash.post("/dlq/requeue", data={"id": "1-1", "csrf": csrf}, headers=SAME_ORIGIN).text
        assert "no dead letter with id &#39;1-1&#39;" in _notice(gone)
        bad = dash.post("/dlq/requeue", data={"id": "<b>", "csrf": csrf}, headers=SAME_ORIGIN).text
        assert "is not a stream entry id" in _notice(bad) and "<b>" not in _notice(bad)
        assert rclient.xlen(DLQ) == 1 and rclient.xlen(QUEUE) == 0

    def test_purge_asks_first_and_refuses_a_stale_confirmation(
        self, make_dashboard: MakeDashboard, rclient: redis.Redis
    ) -> None:
        for n in range(2):
            dead_letter(rclient, reason="r", payload={"n": n})
        dash = make_dashboard()
        csrf = login(dash)
        ask = dash.post("/dlq/purge", data={"csrf": csrf}, headers=SAME_ORIGIN)
        assert ask.status_code == 200 and "yes, delete 2 dead letter(s)" in ask.text and rclient.xlen(DLQ) == 2
        dead_letter(rclient, reason="arrived meanwhile", payload={"n": 9})
        stale = {"csrf": csrf, "confirm": "yes", "expected": "2"}
        assert "not the 2 you confirmed" in _notice(dash.post("/dlq/purge", data=stale, headers=SAME_ORIGIN).text)
        assert rclient.xlen(DLQ) == 3
        fresh = {"csrf": csrf, "confirm": "yes", "expected": "3"}
        assert "purged 3 dead letter(s)" in _notice(dash.post("/dlq/purge", data=fresh, headers=SAME_ORIGIN).text)
        assert rclient.xlen(DLQ) == 0


class TestWorkerControl:
    def test_pause_resume_and_stop_a_real_worker_showing_its_replies(
        self, make_dashboard: MakeDashboard, redis_url: str, rclient: redis.Redis, tmp_path: Path
    ) -> None:
        with ops_worker(redis_url, tmp_path) as w:
            wait_until(lambda: w.control_subscribed(rclient), 10, "control listener subscribed")
            dash = make_dashboard()
            sample(dash)
            csrf = login(dash)
            assert f'value="{w.instance_id}"' in dash.get("/workers").text, "a control row per worker"

            def send(command: str) -> str:
                data = {"instance": w.instance_id, "command": command, "csrf": csrf}
                return _notice(dash.post("/workers/control", data=data, headers=SAME_ORIGIN).text)

            paused = send("pause")
            assert "1 worker(s) received it, 1 answered" in paused
            assert f"{w.instance_id}: pause accepted" in paused
            w.wait_state("PAUSED")
            assert f"{w.instance_id}: resume accepted" in send("resume")
            w.wait_state("READING")
            assert "stop accepted" in send("stop")
            assert w.wait_exit(10) == 0

    def test_control_of_an_unknown_instance_or_command_is_a_message(
        self, make_dashboard: MakeDashboard, rclient: redis.Redis
    ) -> None:
        dash = make_dashboard()
        csrf = login(dash)
        unknown = {"instance": "nobody-123", "command": "pause", "csrf": csrf}
        assert "unknown worker instance" in _notice(
            dash.post("/workers/control", data=unknown, headers=SAME_ORIGIN).text
        )
        nobody = {"instance": "all", "command": "pause", "csrf": csrf}
        assert "no worker is listening" in _notice(dash.post("/workers/control", data=nobody, headers=SAME_ORIGIN).text)
        bad = {"instance": "all", "command": "explode", "csrf": csrf}
        assert "unknown command" in _notice(dash.post("/workers/control", data=bad, headers=SAME_ORIGIN).text)


class TestForkAndDelete:
    def test_fork_from_a_picked_step_runs_the_new_execution_and_leaves_the_original(
        self, make_dashboard: MakeDashboard, rclient: redis.Redis, h: Harness
    ) -> None:
        h.run(start("o1", "ledger3"))
        before = h.store.get("o1")
        dash = make_dashboard()
        csrf = login(dash)
        page = dash.get("/executions/o1").text
        steps = page.split('id="fork-step">')[1].split("</select>")[0]
        assert [s.split('"')[0] for s in steps.split('value="')[1:]] == ["one", "two", "three"]
        form = {"csrf": csrf, "execution_id": "o1", "from_step": "two"}
        after = dash.post("/executions/fork", data=form, headers=SAME_ORIGIN)
        new_id = after.url.path.removeprefix("/executions/")
        assert new_id != "o1" and "forked from &#39;o1&#39; at step &#39;two&#39;" in _notice(after.text)
        (body,) = [json.loads(f["payload"]) for _, f in rclient.xrange(QUEUE)]
        doc = h.run(body)
        assert doc is not None and doc["status"] == "completed" and doc["forked_from"]["execution_id"] == "o1"
        assert [e["step"] for e in doc["history"] if e["outcome"] == "ok"] == ["two", "three"]
        assert h.store.get("o1") == before, "the original is never written"
        bad = dash.post("/executions/fork", data={**form, "from_step": "nine"}, headers=SAME_ORIGIN)
        assert bad.url.path == "/executions/o1" and "never ran a step &#39;nine&#39;" in _notice(bad.text)
        assert dash.post("/executions/fork", data={**form, "csrf": "x"}, headers=SAME_ORIGIN).status_code == 403
        assert rclient.xlen(QUEUE) == 1

    def test_delete_asks_first_deletes_an_ended_one_and_refuses_a_live_one(
        self, make_dashboard: MakeDashboard, h: Harness
    ) -> None:
        h.run(start("d1", "ledger3"))
        h.run(start("s1", "signup"))
        read_only = make_dashboard(allow_actions=False)
        assert 'id="delete"' not in read_only.get("/executions/d1").text
        form = {"execution_id": "d1", "confirm": "yes"}
        assert read_only.post("/executions/delete", data=form, headers=SAME_ORIGIN).status_code == 403
        dash = make_dashboard()
        csrf = login(dash)
        assert 'id="delete"' in dash.get("/executions/d1").text and 'id="delete"' not in dash.get("/executions/s1").text
        ask = dash.post("/executions/delete", data={"csrf": csrf, "execution_id": "d1"}, headers=SAME_ORIGIN)
        assert 'id="delete-confirm"' in ask.text and h.store.get("d1") is not None, "asked, nothing deleted yet"
        cross = dash.post("/executions/delete", data={**form, "csrf": csrf}, headers={"Origin": "http://evil.example"})
        assert cross.status_code == 403 and h.store.get("d1") is not None
        done = dash.post("/executions/delete", data={**form, "csrf": csrf}, headers=SAME_ORIGIN)
        assert done.url.path == "/executions" and "&#39;d1&#39; (completed) deleted" in _notice(done.text)
        assert h.store.get("d1") is None and dash.get("/executions/d1").status_code == 404
        live = dash.post("/executions/delete", data={**form, "csrf": csrf, "execution_id": "s1"}, headers=SAME_ORIGIN)
        assert live.url.path == "/executions/s1" and "is suspended: only an ended one" in _notice(live.text)
        assert (h.store.get("s1") or {}).get("status") == "suspended"

    def test_the_admin_user_with_the_flow_admin_commands_forks_and_deletes_without_a_denial(
        self, make_dashboard: MakeDashboard, redis_server: RedisServer, rclient: redis.Redis, h: Harness
    ) -> None:
        """As docs/operations.md says: the admin line plus the flow-admin line's commands."""
        h.run(start("acl-f", "ledger3"))
        rules = f"{ADMIN_ACL_RULES} {FLOW_ADMIN_ACL_RULES.split(' -@all ', 1)[1]}"
        dash = make_dashboard(url=acl_user(redis_server, "plaita-admin-flows", rules))
        bearer = {"Authorization": f"Bearer {TOKEN}"}
        forked = dash.post("/executions/fork", data={"execution_id": "acl-f", "from_step": "three"}, headers=bearer)
        assert "forked from" in _notice(forked.text) and rclient.xlen(QUEUE) == 1, _notice(forked.text)
        form = {"execution_id": "acl-f", "confirm": "yes"}
        deleted = dash.post("/executions/delete", data=form, headers=bearer)
        assert "deleted with every key" in _notice(deleted.text) and h.store.get("acl-f") is None
        assert [e for e in rclient.acl_log() if e.get("reason") != "auth"] == []
