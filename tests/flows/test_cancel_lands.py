"""Issue 29, item 5: a cancel (or a deadline) that arrives while the last step runs, or while a
step that suspends runs, is never lost. The last step's result is discarded and its staged
writes are not committed (the checkpoint script refuses a ``completed`` result while the cancel
flag is set); a suspension written after a cancel ends ``cancelled`` at once. One runner, a real
lease, a real private redis-server; each step holds in place until the test releases it."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from plaita.flows.model.execution import DEADLINE_EXCEEDED
from plaita.flows.producer.cancel import ALREADY_CANCELLED, CANCELLED, ENDED, QUEUED, RUNNING, request_cancel
from plaita.flows.producer.client import ExecutionNotFound
from plaita.store.executions.flow_limits import TAKEN, FlowLimitStore
from tests.flows import cancel_flows, flowdefs
from tests.flows.support import Harness, ledgers, start
from tests.support.lease_workers import wait_for

pytestmark = pytest.mark.redis

#: The bound of every wait of these tests (a step holds at most ``cancel_flows.MAX_WAIT_S``).
WAIT_S = 20.0


@pytest.fixture
def h(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    monkeypatch.setenv("PLAITA_TEST_REDIS_URL", redis_url)
    harness = Harness(redis_url, flows=cancel_flows.FLOWS, cancel_poll_s=0.1)
    try:
        yield harness
    finally:
        harness.close()


class InThread:
    """``h.run(body)`` on a thread of its own: its document once done, or what it raised."""

    def __init__(self, h: Harness, body: dict[str, Any]) -> None:
        self.doc: dict[str, Any] | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(h, body), daemon=True)
        self._thread.start()

    def _run(self, h: Harness, body: dict[str, Any]) -> None:
        try:
            self.doc = h.run(body)
        except BaseException as exc:  # reported by result()
            self.error = exc

    def result(self) -> dict[str, Any] | None:
        self._thread.join(WAIT_S)
        assert not self._thread.is_alive(), "the task did not end"
        if self.error is not None:
            raise self.error
        return self.doc


def release(eid: str) -> None:
    flowdefs.client().set(cancel_flows.release_key(eid), "1")


def in_step(eid: str, step: str) -> None:
    wait_for(lambda: ledgers(eid, [step]) == [1], WAIT_S, f"{eid} in step {step}")


def test_a_cancel_during_the_last_step_discards_its_result_and_staged_writes(h: Harness) -> None:
    """Before the fix the one-step flow ended ``completed``, its staged write committed."""
    running = InThread(h, start("l1", "last"))
    in_step("l1", "only")
    h.flows.cancel("l1")
    release("l1")  # the step ignores ctx.cancel: it returns a result, which must not be committed
    doc = running.result()
    assert doc is not None and doc["status"] == "cancelled", doc
    assert "only" not in doc["results"]
    assert ledgers("l1", ["only"], "staged") == [0]  # the staged write was not committed
    assert h.client.exists(h.store.ks.cancel_key("l1")) == 0  # the terminal checkpoint took the flag
    assert h.client.zscore(h.store.ks.status_key(0, "cancelled"), "l1") is not None
    assert h.client.zscore(h.store.ks.status_key(0, "running"), "l1") is None


def test_a_one_step_flow_past_its_deadline_ends_cancelled(h: Harness) -> None:
    """The step sees ``ctx.cancel`` at the deadline and returns: before the fix ``completed``."""
    doc = h.run({**start("l2", "polite"), "deadline_at": time.time() + 0.3})
    assert doc is not None and doc["status"] == "cancelled", doc
    assert doc["error"]["type"] == DEADLINE_EXCEEDED
    assert "listen" not in doc["results"] and ledgers("l2", ["listen"], "staged") == [0]


def test_a_cancel_while_a_step_suspends_ends_it_cancelled_at_once(h: Harness) -> None:
    """Cancelled while its step ran (so no cancel task was sent: it was running), the step then
    suspends: before the fix it stayed ``suspended`` with the cancel flag set, for ever."""
    running = InThread(h, start("l3", "pause"))
    in_step("l3", "hold_then_wait")
    h.flows.cancel("l3")
    release("l3")
    doc = running.result()
    assert doc is not None and doc["status"] == "cancelled", doc
    assert h.client.zscore(h.store.ks.status_key(0, "suspended"), "l3") is None
    assert h.client.xlen(h.queue.stream) == 0  # nothing left to do for anyone


def test_a_completed_result_is_written_when_no_cancel_came(h: Harness) -> None:
    release("l4")
    doc = h.run(start("l4", "last"))
    assert doc is not None and doc["status"] == "completed" and doc["results"]["only"] == {"released": True}
    assert ledgers("l4", ["only"], "staged") == [1]


# -- issue 29, item 4: a start waiting for a flow slot ---------------------------------------------
def queued_start(h: Harness, eid: str) -> dict[str, Any]:
    [body] = [json.loads(f[b"payload"]) for _, f in h.client.xrange(h.queue.stream)]  # type: ignore[union-attr]
    assert body["execution_id"] == eid and body["type"] == "start"
    return body


def slot_taken_elsewhere(h: Harness) -> None:
    taken = FlowLimitStore(h.client, h.store.ks).acquire(
        "gated", "elsewhere", "other-worker", max_concurrent=1, ttl_s=30.0, starts_per_s=0, burst=1
    )
    assert taken.code == TAKEN


def test_a_cancelled_start_waiting_for_a_slot_ends_cancelled_without_one(h: Harness) -> None:
    """Before the fix the start went back to the queue for as long as the flow stayed full, then
    ran and completed."""
    slot_taken_elsewhere(h)
    h.flows.start("gated", {}, execution_id="q1")
    body = queued_start(h, "q1")
    assert (h.run(body) or {}).get("status") == "queued"  # waits for its slot, parked: still its record
    h.store.request_cancel("q1")
    doc = h.run(body)
    assert doc is not None and doc["status"] == "cancelled" and doc["history"] == [], doc
    assert ledgers("q1", ["occupy"]) == [0]
    assert FlowLimitStore(h.client, h.store.ks).waiting("gated") == 0, "it left the parked starts"


def test_a_start_waiting_for_a_slot_past_its_deadline_ends_cancelled(h: Harness) -> None:
    slot_taken_elsewhere(h)
    body = {**start("q2", "gated"), "deadline_at": time.time() - 1}
    doc = h.run(body)
    assert doc is not None and doc["status"] == "cancelled" and doc["error"]["type"] == DEADLINE_EXCEEDED, doc
    assert ledgers("q2", ["occupy"]) == [0]


def test_a_queued_start_not_read_yet_is_cancelled_and_runs_no_step(h: Harness) -> None:
    """Before the fix ``cancel`` answered ExecutionNotFound and the start then ran and completed.
    A start recorded ``queued`` by its producer (issue 31, item 2) is answered from its record."""
    release("q3")
    h.flows.start("last", {}, execution_id="q3")
    done = h.flows.cancel("q3")
    assert (done.outcome, done.landed) == (QUEUED, True) and done.status == "queued"
    assert "queued" in done.describe() and "will end cancelled" in done.describe()
    doc = h.run(queued_start(h, "q3"))
    assert doc is not None and doc["status"] == "cancelled" and doc["history"] == [], doc
    assert ledgers("q3", ["only"]) == [0]


def test_a_queued_start_of_an_older_producer_is_found_in_the_stream(h: Harness) -> None:
    """A start enqueued without a record (a producer older than issue 31) has no document until a
    worker reads it: the cancel finds it in the stream, as before."""
    release("q3b")
    h.queue.enqueue(start("q3b", "last"))
    done = h.flows.cancel("q3b")
    assert (done.outcome, done.doc, done.landed) == (QUEUED, None, True)
    doc = h.run(queued_start(h, "q3b"))
    assert doc is not None and doc["status"] == "cancelled" and ledgers("q3b", ["only"]) == [0]


def test_cancel_of_a_start_waiting_for_a_slot_says_so_and_lands(h: Harness) -> None:
    """Before the fix: ExecutionNotFound ("no execution"), then it ran once a slot was free."""
    slot_taken_elsewhere(h)
    h.flows.start("gated", {}, execution_id="q4")
    body = queued_start(h, "q4")
    assert (h.run(body) or {}).get("status") == "queued"  # parked: still its producer's record
    assert h.flows.cancel("q4").outcome == QUEUED
    doc = h.run(body)
    assert doc is not None and doc["status"] == "cancelled" and ledgers("q4", ["occupy"]) == [0]


def test_cancel_of_a_parked_start_puts_it_back_and_it_ends_cancelled(h: Harness) -> None:
    """Issue 31 item 4: a parked start has left the stream (its task was acked); a cancel finds it
    among its flow's parked starts and puts it back on its stream, so it ends ``cancelled`` now
    instead of when a slot frees (before the fix: ExecutionNotFound, then it ran)."""
    slot_taken_elsewhere(h)
    h.flows.start("gated", {}, execution_id="q8")
    body = queued_start(h, "q8")
    assert (h.run(body) or {}).get("status") == "queued"  # parked: still its producer's record
    h.client.delete(h.queue.stream)  # its task acked and deleted, as a worker does
    assert h.flows.cancel("q8").outcome == QUEUED
    doc = h.run(queued_start(h, "q8"))  # the start put back on the stream
    assert doc is not None and doc["status"] == "cancelled" and ledgers("q8", ["occupy"]) == [0]
    assert FlowLimitStore(h.client, h.store.ks).waiting("gated") == 0


def test_a_parked_start_a_worker_ends_before_the_cancel_looks_again_is_reported_cancelled(h: Harness) -> None:
    """CI saw it: the parked start put back on its stream was read and ended ``cancelled`` by a
    worker before the cancel read the document again, and the cancel said "already cancelled" as
    if another had done it. Here the worker reads the start the moment it is put back."""
    slot_taken_elsewhere(h)
    h.flows.start("gated", {}, execution_id="q9")
    body = queued_start(h, "q9")
    assert (h.run(body) or {}).get("status") == "queued"  # parked
    ended: list[dict[str, Any] | None] = []
    done = request_cancel(h.flows.store, lambda b: ended.append(h.run(b)), "q9", h.queue.stream)
    assert [d["status"] for d in ended if d is not None] == ["cancelled"]
    assert done is not None and (done.outcome, done.landed, done.status) == (CANCELLED, True, "cancelled")
    assert done.describe() == "cancel recorded; execution q9 ended cancelled"
    assert h.flows.cancel("q9").outcome == ALREADY_CANCELLED and ledgers("q9", ["occupy"]) == [0]


def test_cancel_says_what_it_did(h: Harness) -> None:
    """Unknown (no document, no start queued): ExecutionNotFound and no flag; running: recorded;
    ended: said so, ``landed`` False for completed only."""
    with pytest.raises(ExecutionNotFound):
        h.flows.cancel("nobody")
    assert h.client.exists(h.store.ks.cancel_key("nobody")) == 0
    h.flows.start("last", {}, execution_id="nobody-else")  # another id's start is no start of it
    with pytest.raises(ExecutionNotFound):
        h.flows.cancel("nobody")
    running = InThread(h, start("q5", "polite"))
    in_step("q5", "listen")
    done = h.flows.cancel("q5")  # CANCELLED: the step saw the flag before the cancel looked again
    assert (done.outcome, done.status) in ((RUNNING, "running"), (CANCELLED, "cancelled")), done
    assert "next checkpoint" in done.describe() or done.outcome == CANCELLED
    assert running.result()["status"] == "cancelled"  # type: ignore[index]
    again = h.flows.cancel("q5")
    assert (again.outcome, again.landed) == (ALREADY_CANCELLED, True)
    release("q6")
    assert h.run(start("q6", "last"))["status"] == "completed"  # type: ignore[index]
    late = h.flows.cancel("q6")
    assert (late.outcome, late.landed) == (ENDED, False) and "already completed" in late.describe()
    assert h.client.exists(h.store.ks.cancel_key("q6")) == 0


def test_a_queued_start_of_another_tenant_is_not_this_tenants(h: Harness) -> None:
    release("tq")
    t1 = h.flows.for_tenant("t1")
    t1.start("last", {}, execution_id="tq")
    with pytest.raises(ExecutionNotFound):  # the default tenant's "tq" is another execution
        h.flows.cancel("tq")
    assert t1.cancel("tq").outcome == QUEUED
    doc = h.run(queued_start(h, "tq"))
    assert doc is not None and doc["status"] == "cancelled" and doc["history"] == [], doc
