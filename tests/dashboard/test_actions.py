"""The dashboard's buttons against real Redis and a real worker: control replies, requeue, purge."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis

from tests.dashboard.conftest import SAME_ORIGIN, MakeDashboard, dead_letter, login, sample
from tests.support.ops import DLQ, QUEUE, ops_worker, wait_until

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
