"""``plaita executions start --deadline-s``: a bad value is exit 2 with one line; a deadline that
passes while the execution waits ends it ``cancelled`` (``--wait`` returns it, exit 1) and
``show`` says why; ``show`` lists what the steps published."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.flows.test_cli import plaita
from tests.support.lease_workers import QUEUE, worker_proc

pytestmark = pytest.mark.redis

WORKER_ARGS = ("--flows", "tests.flows.deadline_flows", "--keeper", "--read-block-ms", "200")


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "1e12", "soon"])
def test_a_bad_deadline_is_exit_2_with_one_line(redis_url: str, rclient: redis.Redis, value: str) -> None:
    r = plaita(redis_url, "executions", "start", "waiter", f"--deadline-s={value}")
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and "--deadline-s" in r.stderr
    assert rclient.exists(QUEUE) == 0  # nothing enqueued


def test_a_deadline_passing_while_suspended_cancels_and_show_says_why(
    redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PLAITA_TEST_REDIS_URL", redis_url)
    _started_past_a_1s_deadline(redis_url, tmp_path, "dl", "waiter", "cd1")
    shown = plaita(redis_url, "executions", "show", "cd1")
    assert shown.returncode == 0, shown.stderr
    assert "status cancelled" in shown.stdout and "deadline " in shown.stdout
    assert "cancelled in wait_event: DeadlineExceeded: deadline exceeded" in shown.stdout


def test_a_one_step_flow_past_its_deadline_ends_cancelled_not_completed(
    redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 29, item 5: the only step sees ``ctx.cancel`` at the deadline and returns; its result
    was written as ``completed`` (a two-step flow ended ``cancelled``). Now it is discarded."""
    monkeypatch.setenv("PLAITA_TEST_REDIS_URL", redis_url)
    doc = _started_past_a_1s_deadline(
        redis_url, tmp_path, "dl1", "polite", "cd2", "--flows", "tests.flows.cancel_flows"
    )
    assert "listen" not in doc["results"]


def _started_past_a_1s_deadline(
    redis_url: str, tmp_path: Path, name: str, flow: str, eid: str, *worker_args: str
) -> dict[str, Any]:
    """``executions start FLOW --deadline-s 1 --wait`` on a worker: the document it printed, which
    must be ``cancelled`` by ``DeadlineExceeded`` (exit 1: ended, not completed)."""
    with worker_proc(redis_url, tmp_path, name, *WORKER_ARGS, *worker_args) as w:
        w.wait_reading()
        r = plaita(
            redis_url, "executions", "start", flow, "--execution-id", eid,
            "--deadline-s", "1", "--wait", "--timeout-s", "30", "--json",
        )  # fmt: skip
        assert w.terminate() == 0
    assert r.returncode == 1, r.stderr
    doc: dict[str, Any] = json.loads(r.stdout)
    assert doc["status"] == "cancelled" and doc["error"]["type"] == "DeadlineExceeded", doc
    return doc
