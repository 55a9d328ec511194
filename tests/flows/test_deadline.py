"""Whole-execution deadlines (``FlowClient.start(deadline_s=...)``, ``--deadline-s``): past the
deadline a running execution is cancelled at its next step boundary (a long step sees
``ctx.cancel``), a suspended or sleeping one by the keeper, its children with it; the
``cancelled`` execution's ``error`` says ``DeadlineExceeded``. Bodies and documents without a
deadline read as before."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from typing import Any

import pytest

from plaita.errors import BadTaskError
from plaita.flows.keeper.keeper import Keeper, KeeperSettings
from plaita.flows.model.execution import DEADLINE_EXCEEDED, Execution
from plaita.ops.keeper_build import build_keeper
from plaita.store.keyspace import DEFAULT
from tests.flows import deadline_flows, fanout_flows, flowdefs
from tests.flows.support import Harness, ledgers, start

pytestmark = pytest.mark.redis

#: Added to the runner's and the keeper's clock once a test wants its deadline passed.
LATER_S = 120.0


class Clock:
    """Wall time plus an offset the test moves forward (the runner's and the keeper's clock)."""

    def __init__(self) -> None:
        self.offset_s = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset_s


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def h(redis_url: str, monkeypatch: pytest.MonkeyPatch, clock: Clock) -> Iterator[Harness]:
    monkeypatch.setenv("PLAITA_TEST_REDIS_URL", redis_url)
    flows = [*flowdefs.FLOWS, *deadline_flows.FLOWS, *fanout_flows.FLOWS]
    harness = Harness(redis_url, flows=flows, clock=clock, cancel_poll_s=0.1)
    try:
        yield harness
    finally:
        harness.close()


def keeper(h: Harness, clock: Clock) -> Keeper:
    return build_keeper(
        h.store, h.queue, KeeperSettings(interval_s=0.1, orphan_grace_s=3600, lease_ttl_s=2), clock=clock
    )


def with_deadline(body: dict[str, Any], deadline_at: float) -> dict[str, Any]:
    return {**body, "deadline_at": deadline_at}


def queued(h: Harness, stream: str) -> list[dict[str, Any]]:
    return [json.loads(f[b"payload"]) for _, f in h.client.xrange(stream)]  # type: ignore[union-attr]


def assert_deadline_cancelled(doc: dict[str, Any] | None) -> None:
    assert doc is not None and doc["status"] == "cancelled", doc
    assert doc["error"]["type"] == DEADLINE_EXCEEDED and "deadline exceeded" in doc["error"]["message"]


def test_a_start_past_its_deadline_runs_no_step(h: Harness) -> None:
    doc = h.run(with_deadline(start("d1"), time.time() - 1))
    assert_deadline_cancelled(doc)
    assert ledgers("d1", ["one", "two", "three"]) == [0, 0, 0]


def test_a_long_step_is_told_and_the_execution_ends_at_the_step_boundary(h: Harness) -> None:
    """The step sees ``ctx.cancel`` once the deadline passes; its result is checkpointed, then the
    execution is cancelled before the next step."""
    doc = h.run(with_deadline(start("d2", "long_step"), time.time() + 0.3))
    assert_deadline_cancelled(doc)
    assert doc is not None and doc["results"]["grind"] == {"released": False, "cut": True}
    assert doc["step"] == "after" and ledgers("d2", ["grind", "after"]) == [1, 0]


def test_a_retry_backoff_does_not_wait_past_the_deadline(h: Harness) -> None:
    """The step's next attempt is a minute away; the deadline, 0.3 s: cancelled at the deadline."""
    doc = h.run(with_deadline(start("d11", "stubborn"), time.time() + 0.3))
    assert_deadline_cancelled(doc)
    # The pause is measured on the monotonic clock, the deadline on the wall clock: were the wall
    # clock a hair behind when the pause ends, one more attempt runs (and then waits for nothing).
    assert ledgers("d11", ["insist"])[0] in (1, 2)


def test_a_suspended_execution_is_cancelled_by_the_keeper(h: Harness, clock: Clock) -> None:
    deadline_at = time.time() + 60
    doc = h.run(with_deadline(start("d3", "waiter"), deadline_at))
    assert doc is not None and doc["status"] == "suspended" and doc["deadline_at"] == deadline_at
    assert doc["suspension"]["deadline"] is None  # its own wait has no timeout; the index has the deadline
    assert h.client.zscore("plaita:executions:deadlines", "d3") == deadline_at
    k = keeper(h, clock)
    assert k.run_once().expired == []  # not yet
    clock.offset_s = LATER_S
    report = k.run_once()
    assert report.expired == ["d3"] and report.timeouts == []
    [task] = queued(h, h.queue.stream)
    assert (task["resume_type"], task["resume_id"]) == ("cancel", "deadline:1")
    assert_deadline_cancelled(h.run(task))
    assert ledgers("d3", ["wait_event"]) == [1]


def test_a_sleep_past_the_deadline_is_cancelled_and_the_next_step_never_runs(h: Harness, clock: Clock) -> None:
    deadline_at = time.time() + 60
    doc = h.run(with_deadline(start("d4", "dozer", sleep_s=3600), deadline_at))
    assert doc is not None and doc["status"] == "suspended" and doc["suspension"]["kind"] == "sleep"
    assert h.client.zscore("plaita:executions:deadlines", "d4") == deadline_at  # the earlier of the two
    clock.offset_s = LATER_S
    assert keeper(h, clock).run_once().expired == ["d4"]
    [task] = queued(h, h.queue.stream)
    assert_deadline_cancelled(h.run(task))
    assert ledgers("d4", ["doze", "woke"]) == [1, 0]


def test_a_suspension_timeout_before_the_deadline_is_still_a_timeout(h: Harness, clock: Clock) -> None:
    doc = h.run(with_deadline(start("d5", "signup", timeout_s=5), time.time() + 3600))
    assert doc is not None and doc["status"] == "suspended"
    clock.offset_s = 10.0
    report = keeper(h, clock).run_once()
    assert report.timeouts == ["d5"] and report.expired == []


def test_a_resume_after_the_deadline_cancels_instead(h: Harness, clock: Clock) -> None:
    h.run(with_deadline(start("d6", "waiter"), time.time() + 60))
    clock.offset_s = LATER_S
    doc = h.run({"type": "resume", "execution_id": "d6", "resume_type": "event", "data": 1})
    assert_deadline_cancelled(doc)
    assert ledgers("d6", ["wait_event"]) == [1]


def test_the_children_of_a_parent_past_its_deadline_are_cancelled(h: Harness, clock: Clock) -> None:
    """The children inherit the deadline; the parent, suspended on them, is cancelled by the
    keeper and cancels them (each is cancelled too, whichever comes first)."""
    deadline_at = time.time() + 60
    h.run(with_deadline(start("dp", "fan", n=3, child={"wait": True}), deadline_at))
    kids = [f"dp:spread:0:{i}" for i in range(3)]
    child_starts = queued(h, h.store.ks.stream(0))
    assert [b["execution_id"] for b in child_starts] == kids
    assert {b["deadline_at"] for b in child_starts} == {deadline_at}
    h.client.delete(h.store.ks.stream(0))
    for body in child_starts:
        assert h.run(body)["status"] == "suspended"  # type: ignore[index]
    clock.offset_s = LATER_S
    assert sorted(keeper(h, clock).run_once().expired) == sorted(["dp", *kids])
    by_id = {t["execution_id"]: t for t in queued(h, h.queue.stream)}
    assert_deadline_cancelled(h.run(by_id["dp"]))
    assert h.client.exists(*[DEFAULT.cancel_key(k) for k in kids]) == 3  # the parent cancelled them
    for task in queued(h, h.store.ks.stream(0)):  # the parent's cancels of its suspended children
        h.run(task)
    for k in kids:
        assert_deadline_cancelled(h.store.get(k))
    assert [flowdefs.ledger(k, "work") for k in kids] == [1, 1, 1]


def test_an_operators_retry_runs_without_the_deadline(h: Harness) -> None:
    h.run(with_deadline(start("d7"), time.time() - 1))
    rid = h.flows.retry("d7")
    [task] = queued(h, h.queue.stream)
    doc = h.run(task)
    assert doc is not None and doc["status"] == "completed" and "deadline_at" not in doc
    assert rid in doc["applied_resumes"] and ledgers("d7", ["one", "two", "three"]) == [1, 1, 1]


@pytest.mark.parametrize("bad", ["soon", True, [1], {"at": 1}])
def test_a_start_with_a_malformed_deadline_is_a_bad_task(h: Harness, bad: Any) -> None:
    with pytest.raises(BadTaskError, match="deadline_at"):
        h.run(with_deadline(start("d8"), bad))
    assert h.store.get("d8") is None


def test_bodies_and_documents_without_a_deadline_read_as_before(h: Harness) -> None:
    doc = h.run(start("d9"))
    assert doc is not None and doc["status"] == "completed" and "deadline_at" not in doc
    old = {k: v for k, v in doc.items() if k != "deadline_at"}
    assert Execution.decode(old).deadline_at is None
    assert Execution.decode({**old, "deadline_at": "x"}).deadline_at is None  # unreadable: none


@pytest.mark.parametrize("deadline_s", [0, -1, math.nan, math.inf, 11 * 366 * 86400, "5", True])
def test_the_client_refuses_a_deadline_out_of_bounds(h: Harness, deadline_s: Any) -> None:
    with pytest.raises(ValueError, match="deadline_s"):
        h.flows.start("ledger3", deadline_s=deadline_s)
    assert h.client.xlen(h.queue.stream) == 0


def test_the_client_sends_an_absolute_deadline(h: Harness) -> None:
    before = time.time()
    eid = h.flows.start("ledger3", deadline_s=30)
    [body] = queued(h, h.queue.stream)
    assert body["execution_id"] == eid and before + 30 <= body["deadline_at"] <= time.time() + 30
