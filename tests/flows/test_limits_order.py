"""Issue 31, items 4 and 5, on one runner and a real redis-server: starts waiting for a slot of a
``max_concurrent`` flow are parked and run in the order they were started (not re-read), a
parked start whose promotion was lost is promoted again, and ``rate_limit=(N, period_s)`` lets
no window of ``period_s`` hold more than N starts (the first window exactly N)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from plaita.errors import NotForThisWorker
from plaita.flows import Flow, StepContext
from plaita.store.executions.flow_limits import FULL, PARKED, RATE_LIMITED, TAKEN, flow_keys
from tests.flows.limitdefs import suspend_once
from tests.flows.support import Harness, harness, limits, start
from tests.support.lease_workers import wait_for

pytestmark = pytest.mark.redis

line = Flow("line", max_concurrent=1)
line.step(name="wait_here")(suspend_once)


windowed = Flow("windowed", rate_limit=(3, 60.0))


@windowed.step
def only(ctx: StepContext) -> str:
    return "done"


@pytest.fixture
def h(redis_url: str) -> Iterator[Harness]:
    with harness(redis_url, flows=[line, windowed], slot_ttl_s=30.0) as opened:
        yield opened


def promoted(h: Harness) -> list[dict[str, Any]]:
    """The starts put back on the stream so far, oldest first."""
    entries = h.client.xrange(h.store.ks.stream(0))
    return [json.loads(f[b"payload"]) for _, f in entries]  # type: ignore[union-attr]


def test_waiting_starts_run_in_the_order_they_were_started(h: Harness) -> None:
    """Issue 31 item 4. Five starts read out of order while the one slot is held: each parks (no
    hand-back, nothing created); every time the slot frees, the oldest by stream id is put back
    on its stream and takes it. Before the fix each start was handed back to be re-read, and
    whichever retried first after a release ran first."""
    assert limits(h).acquire("line", "holder", "tok", max_concurrent=1, ttl_s=30, starts_per_s=0, burst=1).code == TAKEN
    read_order = [5, 1, 3, 2, 4]
    for n in read_order:
        assert h.run(start(f"o{n}", "line"), message_id=f"100{n}-0") is None
    assert limits(h).waiting("line") == 5
    assert all(h.store.get(f"o{n}") is None for n in read_order)
    assert limits(h).release("line", "holder", "tok", max_concurrent=1, ttl_s=30.0)
    ran = []
    for _ in read_order:
        body = promoted(h)[-1]
        ran.append(body["execution_id"])
        assert h.run(body)["status"] == "suspended"  # type: ignore[index]  # gives its slot to the next
    assert ran == [f"o{n}" for n in sorted(read_order)]
    assert limits(h).waiting("line") == 0
    assert len(promoted(h)) == 5, "each start was put back once"


def test_a_new_start_does_not_overtake_a_parked_one(h: Harness) -> None:
    """Issue 31 item 4: once starts are parked, a later start parks behind them even when it
    arrives as the slot frees: the freed slot is reserved for the oldest parked start."""
    assert limits(h).acquire("line", "holder", "tok", max_concurrent=1, ttl_s=30, starts_per_s=0, burst=1).code == TAKEN
    assert h.run(start("first", "line"), message_id="2001-0") is None
    assert limits(h).release("line", "holder", "tok", max_concurrent=1, ttl_s=30.0)
    assert h.run(start("late", "line"), message_id="2002-0") is None, "the free slot is first's"
    assert h.run(promoted(h)[-1])["status"] == "suspended"  # type: ignore[index]
    assert [b["execution_id"] for b in promoted(h)] == ["first", "late"]


def test_a_lost_promotion_is_promoted_again_by_the_sweep(h: Harness, rclient: redis.Redis) -> None:
    """Issue 31 item 4, crash window: a worker reserved the slot for a parked start and died before
    putting it back on its stream (played by deleting the stream). The reservation expires, the
    start is still parked, and the sweep promotes it again: never lost."""
    assert limits(h).acquire("line", "holder", "tok", max_concurrent=1, ttl_s=30, starts_per_s=0, burst=1).code == TAKEN
    assert h.run(start("lost", "line"), message_id="3001-0") is None
    assert limits(h).release("line", "holder", "tok", max_concurrent=1, ttl_s=0.2)  # a 200 ms reservation
    rclient.delete(h.store.ks.stream(0))
    keys = flow_keys(h.store.ks, "line")
    wait_for(lambda: limits(h).holders("line") == 0, 10.0, "the reservation expired")
    assert rclient.zscore(keys.parked, "lost") is not None
    assert limits(h).promote("line", max_concurrent=1, ttl_s=30.0) == 1
    assert [b["execution_id"] for b in promoted(h)] == ["lost"]
    assert h.run(promoted(h)[-1])["status"] == "suspended"  # type: ignore[index]


def test_a_parked_start_past_its_deadline_is_put_back_and_ends_cancelled(h: Harness) -> None:
    """Issue 31 item 4: a parked start whose deadline passes does not wait for its turn: the sweep
    puts it back on its stream (no slot reserved), and read, it takes no slot, leaves the parked
    starts and ends ``cancelled``; the start parked behind it is not held up."""
    assert limits(h).acquire("line", "holder", "tok", max_concurrent=1, ttl_s=30, starts_per_s=0, burst=1).code == TAKEN
    soon = time.time() + 0.3
    assert h.run({**start("late", "line"), "deadline_at": soon}, message_id="4001-0") is None
    assert h.run(start("next", "line"), message_id="4002-0") is None
    wait_for(lambda: time.time() > soon + 0.05, 5.0, "the deadline passed")
    assert limits(h).promote("line", max_concurrent=1, ttl_s=30.0) == 2
    [body] = promoted(h)
    assert body["execution_id"] == "late" and limits(h).holders("line") == 1, "put back without a slot"
    doc = h.run(body)
    assert doc is not None and doc["status"] == "cancelled"
    assert limits(h).waiting("line") == 1
    assert limits(h).release("line", "holder", "tok", max_concurrent=1, ttl_s=30.0)
    assert [b["execution_id"] for b in promoted(h)] == ["late", "next"]


def test_a_start_parks_only_for_a_slot_not_for_a_resume(h: Harness) -> None:
    """Issue 31 item 4: the store parks a start (PARKED) and refuses a resume as before."""
    store = limits(h)
    opts: dict[str, Any] = {"max_concurrent": 1, "ttl_s": 30, "starts_per_s": 0, "burst": 1}
    assert store.acquire("line", "a", "t", **opts).code == TAKEN
    assert store.acquire("line", "b", "t2", park=(1.0, start("b", "line"), None), **opts).code == PARKED
    assert store.acquire("line", "c", "t3", **opts).code == FULL


def test_rate_limit_lets_n_through_in_the_first_window_then_waits(h: Harness) -> None:
    """Issue 31 item 5: ``rate_limit=(3, 60)``: three waiting starts all pass at once, the fourth
    is handed back to wait for the oldest to leave the window (about 60 s, not a token's 20 s)."""
    for n in range(3):
        assert h.run(start(f"w{n}", "windowed"))["status"] == "completed"  # type: ignore[index]
    with pytest.raises(NotForThisWorker):
        h.run(start("w3", "windowed"))
    admit = limits(h).acquire(
        "windowed", "w3", "t", max_concurrent=0, ttl_s=30, starts_per_s=0, burst=1, window=(3, 60.0)
    )
    assert admit.code == RATE_LIMITED and 59.0 < admit.wait_s <= 60.001
    assert h.store.get("w3") is None


def test_no_window_of_period_holds_more_than_n_starts(h: Harness, rclient: redis.Redis) -> None:
    """Issue 31 item 5: starts of (2 per 300 ms) taken as fast as allowed: by the server's clock,
    any three consecutive starts span more than 300 ms."""
    store, window = limits(h), flow_keys(h.store.ks, "fast").window
    times: list[float] = []

    def take_one() -> bool:
        token = f"t{len(times)}"  # unique per acquire, as the runner's
        admit = store.acquire("fast", "x", token, max_concurrent=0, ttl_s=30, starts_per_s=0, burst=1, window=(2, 0.3))
        if admit.code != TAKEN:
            return False
        times.append(max(score for _, score in rclient.zrange(window, 0, -1, withscores=True)))
        return True

    for _ in range(8):
        wait_for(take_one, 10.0, "the next start passes")
    assert times[1] - times[0] < 300, "the first window lets both through at once"
    assert all(times[i + 2] - times[i] > 300 for i in range(len(times) - 2)), times
