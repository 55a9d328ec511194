"""Addressed resumes (issue 31 item 7, ``plaita.flows.model.inbox``): a resume names the wait it is
for; one that comes before its wait is kept in the execution until that wait runs, instead of
being taken by whatever wait came first. Each test says which part of the promise it guards."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest

from plaita.errors import BadTaskError
from plaita.flows.model.inbox import MAX_PARKED
from plaita.flows.producer.client import NotResumable
from tests.flows import waitdefs
from tests.flows.support import Harness, harness, resume, start
from tests.flows.test_cli import plaita

pytestmark = pytest.mark.redis

PAYMENT = {"amount": 42}


@pytest.fixture
def h(redis_url: str) -> Iterator[Harness]:
    with harness(redis_url, flows=waitdefs.FLOWS) as opened:
        yield opened


def _payment(eid: str, rid: str = "pay-1") -> dict[str, object]:
    return resume(eid, "event", PAYMENT, resume_id=rid, wait_for="payment")


def test_an_early_payment_is_kept_for_its_wait_not_taken_by_the_approval(h: Harness) -> None:
    """The order pipeline: the payment webhook came while the order waited for its approval. It
    was taken by the approval wait, and the payment wait then waited out its timeout."""
    assert h.run(start("o1", "order"))["status"] == "suspended"  # type: ignore[index]
    doc = h.run(_payment("o1"))
    assert doc is not None and doc["status"] == "suspended" and doc["suspension"]["step"] == "approve"
    assert [(e["id"], e["wait_for"], e["data"]) for e in doc["inbox"]] == [("pay-1", "payment", PAYMENT)]
    again = h.run(_payment("o1"))  # the provider's retry of the same event: received already
    assert again is not None and len(again["inbox"]) == 1
    doc = h.run(resume("o1", "event", "yes", resume_id="ok-1"))  # the approval
    assert doc is not None and doc["status"] == "completed" and "inbox" not in doc
    assert doc["results"]["approve"] == {"approved": "yes"}
    assert doc["results"]["await_payment"] == {"paid": PAYMENT, "resume_type": "event"}
    took = [(e["step"], e["resume_id"], e.get("wait_for")) for e in doc["history"] if e["outcome"] == "resumed"]
    assert took == [("approve", "ok-1", None), ("await_payment", "pay-1", "payment")]
    assert h.client.zscore("plaita:executions:deadlines", "o1") is None  # no 10-minute timeout left armed


def test_a_resume_for_another_wait_keeps_the_current_waits_deadline(h: Harness) -> None:
    """Kept while suspended in another wait: the execution stays in that wait, its timeout armed."""
    h.run(start("o2", "order"))
    h.run(resume("o2", "event", "yes", resume_id="ok-2"))
    doc = h.store.get("o2")
    assert doc is not None and doc["suspension"]["wait_for"] == "payment"
    deadline = h.client.zscore("plaita:executions:deadlines", "o2")
    assert deadline is not None
    doc = h.run(resume("o2", "event", "later", resume_id="ship-1", wait_for="shipping"))
    assert doc is not None and doc["status"] == "suspended" and doc["suspension"]["wait_for"] == "payment"
    assert [e["id"] for e in doc["inbox"]] == ["ship-1"]
    assert h.client.zscore("plaita:executions:deadlines", "o2") == deadline
    doc = h.run(_payment("o2"))  # the wait it is in takes its own at once
    assert doc is not None and doc["status"] == "completed" and doc["results"]["await_payment"]["paid"] == PAYMENT


def test_a_kept_resume_no_wait_took_is_logged_when_the_execution_ends(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    h.run(start("o3", "order"))
    h.run(resume("o3", "event", "x", resume_id="stray", wait_for="refund"))
    h.run(resume("o3", "event", "yes", resume_id="ok-3"))
    with caplog.at_level(logging.WARNING, logger="plaita.flows.runner.engine"):
        assert h.run(_payment("o3"))["status"] == "completed"  # type: ignore[index]
    assert any("no wait took its resumes stray (refund)" in r.getMessage() for r in caplog.records)


def test_a_resume_that_comes_during_a_sleep_is_kept_for_the_wait_after_it(h: Harness) -> None:
    """Before, an event during a durable sleep was ignored (logged only); an addressed one is kept."""
    assert h.run(start("n1", "napped"))["status"] == "suspended"  # type: ignore[index]
    doc = h.run(_payment("n1"))
    assert doc is not None and doc["suspension"]["kind"] == "sleep" and len(doc["inbox"]) == 1
    doc = h.run(resume("n1", "continue", resume_id="wake-1"))  # the keeper's wake at the deadline
    assert doc is not None and doc["status"] == "completed" and doc["results"]["pay"] == {"paid": PAYMENT}


def test_a_worker_that_died_mid_step_keeps_the_resume_for_the_next_wait(h: Harness) -> None:
    """The execution is ``running`` (its worker died in ``approve``): the addressed resume's task
    continues it, and ``await_payment`` takes the resume when it suspends."""
    h.run(start("o4", "order"))
    raw = h.client.get("plaita:execution:o4")
    doc = json.loads(raw)  # as a worker that applied the approval and died in the step leaves it
    doc.update(status="running", suspension=None, resume={"type": "event", "data": "yes"})
    h.client.set("plaita:execution:o4", json.dumps(doc))
    done = h.run(_payment("o4"))
    assert done is not None and done["status"] == "completed"
    assert done["results"]["await_payment"]["paid"] == PAYMENT and "inbox" not in done


def test_at_most_max_parked_resumes_are_kept_then_one_more_is_refused(h: Harness) -> None:
    h.run(start("o5", "order"))
    for i in range(MAX_PARKED):
        h.run(resume("o5", "event", i, resume_id=f"r{i}", wait_for="payment"))
    with pytest.raises(BadTaskError, match="already keeps 32 resumes"):
        h.run(resume("o5", "event", 99, resume_id="one-more", wait_for="payment"))
    doc = h.store.get("o5")
    assert doc is not None and len(doc["inbox"]) == MAX_PARKED and doc["status"] == "suspended"


def test_a_bad_wait_name_in_a_task_is_refused_with_why(h: Harness) -> None:
    h.run(start("o6", "order"))
    with pytest.raises(BadTaskError, match="wait_for"):
        h.run(resume("o6", "event", 1, wait_for=""))
    with pytest.raises(BadTaskError, match="takes none"):
        h.run(resume("o6", "continue", wait_for="payment"))


def test_the_client_refuses_what_can_never_match_and_bad_names(h: Harness) -> None:
    h.run(start("o7", "order"))
    with pytest.raises(ValueError, match="wait_for"):
        h.flows.resume("o7", "event", 1, wait_for="")
    with pytest.raises(ValueError, match="takes none"):
        h.flows.resume("o7", "timeout", wait_for="payment")
    h.run(resume("o7", "cancel"))
    with pytest.raises(NotResumable, match="cancelled"):
        h.flows.resume("o7", "event", 1, wait_for="payment")


def test_show_prints_the_wait_the_kept_resumes_and_which_resume_each_step_took(h: Harness, redis_url: str) -> None:
    h.run(start("o8", "order"))
    h.run(_payment("o8", "pay-8"))
    shown = plaita(redis_url, "executions", "show", "o8")
    assert shown.returncode == 0, shown.stderr
    assert "resume pay-8 for wait payment kept since" in shown.stdout
    h.run(resume("o8", "event", "yes", resume_id="ok-8"))
    shown = plaita(redis_url, "executions", "show", "o8")
    assert "resumed" in shown.stdout and "by pay-8 (payment)" in shown.stdout and "by ok-8 (event)" in shown.stdout


def test_the_cli_addresses_a_resume_with_wait_for(h: Harness, redis_url: str) -> None:
    h.run(start("o9", "order"))
    r = plaita(redis_url, "executions", "resume", "o9", "--wait-for", "payment", "--data", '{"amount": 42}')
    assert r.returncode == 0, r.stderr
    [(mid, fields)] = h.client.xrange(h.queue.streams[0])[-1:]
    body = json.loads(fields[b"payload"])
    assert body["wait_for"] == "payment" and body["data"] == PAYMENT
    doc = h.run(body, message_id=mid.decode())
    assert doc is not None and [e["id"] for e in doc["inbox"]] == [mid.decode()]
    bad = plaita(redis_url, "executions", "resume", "o9", "--type", "continue", "--wait-for", "payment")
    assert bad.returncode != 0 and "takes none" in bad.stderr and "Traceback" not in bad.stderr
