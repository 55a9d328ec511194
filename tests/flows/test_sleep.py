"""Durable sleep (``ctx.sleep``): a suspension whose deadline wakes it with ``continue`` and runs
the NEXT step; surviving kill -9; the keeper wakes it within a second of its deadline."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from plaita.flows.keeper.keeper import KeeperSettings
from plaita.flows.producer.client import FlowClient
from plaita.ops.keeper_build import build_keeper
from tests.flows import flowdefs, sleepdefs
from tests.flows.support import Harness, ledgers, resume, start
from tests.support.lease_workers import FAST_RECLAIM_ARGS, wait_for, worker_proc

pytestmark = pytest.mark.redis

WORKER_ARGS = (
    "--flows", "tests.flows.flowdefs",
    "--flows", "tests.flows.sleepdefs",
    *FAST_RECLAIM_ARGS,
)  # fmt: skip


@pytest.fixture
def h(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    monkeypatch.setenv("PLAITA_TEST_REDIS_URL", redis_url)
    harness = Harness(redis_url, flows=[*flowdefs.FLOWS, *sleepdefs.FLOWS])
    try:
        yield harness
    finally:
        harness.close()


def test_a_sleep_suspends_at_its_deadline_and_continue_runs_the_next_step(h: Harness) -> None:
    doc = h.run(start("s1", "napper", sleep_s=3600))
    assert doc is not None and doc["status"] == "suspended"
    susp = doc["suspension"]
    assert susp["kind"] == "sleep" and susp["step"] == "before" and susp["next"] == "after"
    assert susp["deadline"] == pytest.approx(time.time() + 3600, abs=30)
    assert h.client.zscore("plaita:executions:deadlines", "s1") == susp["deadline"]
    assert doc["state"] == {"before": True} and doc["results"] == {"before": None}
    assert doc["history"][-1]["outcome"] == "sleep"
    # An event does not cut the sleep short: ignored, nothing recorded, nothing run.
    assert h.run(resume("s1", "event", "hi", resume_id="ev"))["status"] == "suspended"  # type: ignore[index]
    assert h.run(resume("s1", "retry"))["status"] == "suspended"  # type: ignore[index]
    # A wake for another suspension is stale: nothing happens.
    stale = resume("s1", "continue", suspension=susp["seq"] + 1, resume_id="wake:x")
    assert h.run(stale)["status"] == "suspended"  # type: ignore[index]
    assert ledgers("s1", ["before", "after"]) == [1, 0]
    # continue (what the keeper sends at the deadline, or anyone earlier) wakes it.
    wake = resume("s1", "continue", suspension=susp["seq"], resume_id=f"wake:{susp['seq']}")
    doc = h.run(wake)
    assert doc is not None and doc["status"] == "completed"
    assert doc["state"]["resume_seen"] is None  # the next step is not "resumed": it runs afresh
    assert doc["state"]["kept"] is True and ledgers("s1", ["before", "after"]) == [1, 1]
    assert h.client.zscore("plaita:executions:deadlines", "s1") is None
    # A redelivered wake is a no-op.
    assert h.run(wake)["status"] == "completed" and ledgers("s1", ["before", "after"]) == [1, 1]  # type: ignore[index]


def test_a_sleep_in_the_last_step_completes_the_execution_when_it_wakes(h: Harness) -> None:
    doc = h.run(start("s2", "nap_last", sleep_s=60))
    assert doc is not None and doc["status"] == "suspended" and doc["suspension"]["next"] is None
    doc = h.run(resume("s2", "timeout", suspension=doc["suspension"]["seq"]))  # an older keeper's wake
    assert doc is not None and doc["status"] == "completed" and ledgers("s2", ["only"]) == [1]


def test_an_operators_continue_ends_a_sleep_early(h: Harness) -> None:
    h.run(start("s5", "napper", sleep_s=3600))
    doc = h.run(resume("s5", "continue"))  # plaita executions resume ID --type continue
    assert doc is not None and doc["status"] == "completed" and ledgers("s5", ["before", "after"]) == [1, 1]


def test_a_sleeping_execution_is_cancelled_at_once(h: Harness) -> None:
    h.run(start("s3", "napper", sleep_s=60))
    h.flows.cancel("s3")
    doc = h.run(resume("s3", "cancel"))
    assert doc is not None and doc["status"] == "cancelled" and ledgers("s3", ["before", "after"]) == [1, 0]


def test_the_keeper_wakes_a_due_sleep_with_continue(h: Harness) -> None:
    doc = h.run(start("s4", "napper", until_s=time.time() - 5))  # already past: due at once
    assert doc is not None and doc["status"] == "suspended"
    report = build_keeper(h.store, h.queue, KeeperSettings()).run_once()
    assert report.wakes == ["s4"] and report.timeouts == []
    [(_, fields)] = h.client.xrange(h.queue.streams[0])[-1:]
    body = fields.get(b"payload") or fields.get("payload")
    assert b'"resume_type": "continue"' in body or b'"resume_type":"continue"' in body  # type: ignore[operator]


def test_kill9_while_sleeping_a_new_worker_and_keeper_wake_it(
    redis_url: str, flows: FlowClient, tmp_path: Path
) -> None:
    eid = flows.start("napper", {"sleep_s": 3})
    with worker_proc(redis_url, tmp_path, "sa", *WORKER_ARGS) as a:
        wait_for(lambda: (flows.get(eid) or {}).get("status") == "suspended", 15, "the execution sleeping")
        a.kill9()
    deadline_s = flows.get(eid)["suspension"]["deadline"]  # type: ignore[index]
    with worker_proc(redis_url, tmp_path, "sb", *WORKER_ARGS, "--keeper") as b:
        doc = flows.wait(eid, 30)
        assert b.terminate() == 0
    assert doc["status"] == "completed" and doc["state"]["kept"] is True
    assert ledgers(eid, ["before", "after"]) == [1, 1]
    assert ledgers(eid, ["before", "after"], "staged") == [1, 1]
    woke_s = float(flowdefs.client().get(f"plaita:test:woke:{eid}"))  # type: ignore[arg-type]
    assert woke_s >= deadline_s


def test_the_keeper_wakes_a_sleep_within_a_second_of_its_deadline(
    redis_url: str, flows: FlowClient, tmp_path: Path
) -> None:
    """With the default keeper interval (5 s): the keeper peeks at the earliest deadline every
    0.25 s, so a 2 s sleep started between two passes wakes well before the next pass."""
    lateness: list[float] = []
    with worker_proc(redis_url, tmp_path, "sl", *WORKER_ARGS, "--keeper") as w:
        w.wait_reading()
        for _ in range(3):
            eid = flows.start("napper", {"sleep_s": 2})
            doc = flows.wait(eid, 30)
            assert doc["status"] == "completed"
            deadline_s = next(e for e in doc["history"] if e["outcome"] == "sleep")["ended_at"] + 2
            lateness.append(float(flowdefs.client().get(f"plaita:test:woke:{eid}")) - deadline_s)  # type: ignore[arg-type]
        assert w.terminate() == 0
    print(f"sleep wake lateness (s): {[round(x, 3) for x in lateness]}")
    assert all(0 <= x < 1.5 for x in lateness), lateness  # measured about 0.25 s
