"""Recovering from the dead-letter queue with `plaita dlq list | show | requeue | purge`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis

from tests.support.ops import DLQ, QUEUE, enqueue, ops_worker, plaita, plaita_json, task, wait_until

pytestmark = pytest.mark.redis


def _listed(redis_url: str, failing_id: str, malformed_id: str) -> str:
    """``dlq list`` (JSON and table) shows both dead letters with their reasons; the failing one's DLQ id."""
    rows = {r["source_id"]: r for r in plaita_json(redis_url, "dlq", "list")}
    assert set(rows) == {failing_id, malformed_id}
    assert rows[failing_id]["delivery_count"] == 2 and "boom 42" in rows[failing_id]["reason"]
    assert "JSON" in rows[malformed_id]["reason"] and rows[malformed_id]["payload"] == "{not json"
    table = plaita(redis_url, "dlq", "list")
    assert table.returncode == 0 and table.stdout.split()[:2] == ["DLQ_ID", "SOURCE_ID"]
    assert failing_id in table.stdout and malformed_id in table.stdout
    return str(rows[failing_id]["dlq_id"])


class TestDeadLetterRoundTrip:
    def test_list_show_requeue_and_the_requeued_task_runs_fresh(
        self, rclient: redis.Redis, redis_url: str, tmp_path: Path
    ) -> None:
        """Failed and malformed tasks land in the DLQ; show prints the envelope; requeue keeps the body, delivery 1."""
        with ops_worker(
            redis_url, tmp_path, "--max-deliveries", "2", "--claim-min-idle-ms", "200", "--reclaim-interval-s", "0.2"
        ) as w:
            failing_body = task(42, fail=True)
            failing_id = enqueue(rclient, failing_body)
            malformed_id = enqueue(rclient, "{not json")
            wait_until(lambda: rclient.xlen(DLQ) == 2, 10, "two dead letters")
            runs = [(mid, d) for event, mid, _n, d in w.executions() if event == "start"]
            assert runs == [(failing_id, 1), (failing_id, 2)], "dead-lettered after --max-deliveries runs"

            dlq_id = _listed(redis_url, failing_id, malformed_id)
            shown = plaita(redis_url, "dlq", "show", dlq_id)
            assert shown.returncode == 0, shown.stderr
            envelope = json.loads(shown.stdout)
            assert envelope["payload"] == failing_body and envelope["source_stream"] == QUEUE
            assert envelope["source_id"] == failing_id and envelope["dead_lettered_at"] > 0

            moved = plaita_json(redis_url, "dlq", "requeue", dlq_id)
            assert [m["dlq_id"] for m in moved] == [dlq_id]
            new_id = moved[0]["new_id"]
            assert new_id != failing_id
            wait_until(lambda: (new_id, 1) in [(m, d) for e, m, _n, d in w.executions() if e == "start"], 5,
                       "the requeued task to run with delivery count 1")  # fmt: skip
            started = [(n, d) for e, m, n, d in w.executions() if e == "start" and m == new_id]
            assert started[0] == ("42", 1), "same body (n=42), a fresh delivery count"
            # It fails again (same body): back in the DLQ with the same payload after two deliveries.
            wait_until(lambda: rclient.xlen(DLQ) == 2, 10, "the requeued task back in the DLQ")
            again = {r["source_id"]: r for r in plaita_json(redis_url, "dlq", "list")}[new_id]
            assert again["payload"] == failing_body and again["delivery_count"] == 2
            assert w.terminate() == 0

    def test_purge_needs_yes_without_a_terminal(self, rclient: redis.Redis, redis_url: str) -> None:
        """`dlq purge` without --yes and without a TTY exits 1 and deletes nothing; with --yes it deletes all."""
        for n in range(3):
            rclient.xadd(DLQ, {"payload": json.dumps({"reason": "test", "payload": task(n)})})
        refused = plaita(redis_url, "dlq", "purge")
        assert refused.returncode == 1 and "without --yes" in refused.stderr
        assert rclient.xlen(DLQ) == 3
        purged = plaita(redis_url, "dlq", "purge", "--yes")
        assert purged.returncode == 0 and "purged 3 dead letter(s)" in purged.stdout
        assert rclient.exists(DLQ) == 0
        assert plaita_json(redis_url, "dlq", "list") == []

    def test_bad_ids_exit_1_and_change_nothing(self, rclient: redis.Redis, redis_url: str) -> None:
        """show/requeue of an unknown or malformed id exit 1; a requeue with one bad id moves nothing."""
        good = rclient.xadd(DLQ, {"payload": json.dumps({"reason": "test", "payload": task(1)})})
        for args in (("show", "1-1"), ("show", "bogus"), ("requeue", good, "1-1"), ("requeue", "bogus"), ("requeue",)):
            done = plaita(redis_url, "dlq", *args)
            assert done.returncode == 1 and done.stderr.startswith("plaita dlq: "), (args, done.stderr)
            assert "Traceback" not in done.stderr
        assert rclient.xlen(DLQ) == 1 and rclient.exists(QUEUE) == 0, "a failed requeue is all or nothing"
