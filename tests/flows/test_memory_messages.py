"""Messages (``ctx.recv``), on ``MemoryIO`` (no server): the engine turns a recv with no message
at hand into a wait for its topic, and messages kept before it are taken oldest first, one per
run of the step. Delivery through ``FlowClient.send`` on a real server: ``test_messages.py``."""

from __future__ import annotations

from typing import Any

from plaita.flows import Flow, StepContext
from tests.flows import msgdefs
from tests.flows.memory import memory_runner, resume, start

flaky = Flow("msg-flaky")
_failures: list[Any] = []


@flaky.step(base_s=0, cap_s=0)
def take(ctx: StepContext) -> Any:
    msg = ctx.recv("t")
    if not _failures:
        _failures.append(msg)
        raise RuntimeError("failed after it received")
    return {"msg": msg}


def _message(eid: str, n: int) -> dict[str, object]:
    return resume(eid, "event", data=n, resume_id=f"msg-{n}", wait_for="t")


def test_a_recv_suspends_for_its_topic_and_the_step_runs_again_with_the_message() -> None:
    with memory_runner(msgdefs.FLOWS) as m:
        doc = m.run(start("r1", "msg-inbox"))
        assert doc is not None and doc["status"] == "suspended"
        assert (doc["suspension"]["step"], doc["suspension"]["wait_for"]) == ("collect", "t")
        doc = m.run(_message("r1", 1))
        assert doc is not None and doc["status"] == "suspended" and doc["state"]["got"] == [1]


def test_kept_messages_are_taken_oldest_first_without_suspending() -> None:
    with memory_runner(msgdefs.FLOWS) as m:
        m.run(start("r2", "msg-inbox", gate=True))
        for n in (3, 1, 2):
            m.run(_message("r2", n))
        doc = m.run(resume("r2", "event", data=None, resume_id="go", wait_for="go"))
    assert doc is not None and doc["status"] == "completed" and doc["results"]["collect"] == {"got": [3, 1, 2]}


def test_a_step_that_fails_after_its_recv_gets_the_same_message_on_its_next_attempt() -> None:
    _failures.clear()
    with memory_runner([flaky]) as m:
        m.run(start("r3", "msg-flaky"))
        doc = m.run(_message("r3", 7))
    assert _failures == [7]
    assert doc is not None and doc["status"] == "completed" and doc["results"]["take"] == {"msg": 7}


def test_an_operators_retry_of_the_wait_waits_again() -> None:
    with memory_runner(msgdefs.FLOWS) as m:
        m.run(start("r4", "msg-inbox"))
        doc = m.run(resume("r4", "retry", resume_id="again"))
        assert doc is not None and doc["status"] == "suspended" and doc["suspension"]["wait_for"] == "t"
        assert "got" not in doc["state"]
