"""Retry / restart from a step (``FlowClient.retry``, ``plaita executions retry``): a fenced
``restart`` task that puts an error, cancelled (or, with force, completed) execution back to
running at a step, keeping the results before it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from plaita.flows.model.bodies import restart_body
from plaita.flows.producer.client import FlowClient, NotRetryable
from tests.flows import flowdefs, sleepdefs
from tests.flows.support import Harness, ledgers, resume, start
from tests.flows.test_sleep import WORKER_ARGS
from tests.support.lease_workers import wait_for, worker_proc

pytestmark = pytest.mark.redis

STEPS = ["a", "b", "c"]


@pytest.fixture
def h(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    monkeypatch.setenv("PLAITA_TEST_REDIS_URL", redis_url)
    harness = Harness(redis_url, flows=[*flowdefs.FLOWS, *sleepdefs.FLOWS])
    try:
        yield harness
    finally:
        harness.close()


def _broken(eid: str, on: bool) -> None:
    key = f"plaita:test:broken:{eid}"
    flowdefs.client().set(key, 1) if on else flowdefs.client().delete(key)


def _restart(eid: str, rid: str, from_step: str | None = None, force: bool = False) -> dict[str, object]:
    return restart_body(eid, flow_id="fixable", from_step=from_step, force=force, by="ann@test", resume_id=rid)


def test_retry_of_an_error_execution_reruns_only_the_failed_step_and_those_after(
    redis_url: str, flows: FlowClient, tmp_path: Path
) -> None:
    with worker_proc(redis_url, tmp_path, "ra", *WORKER_ARGS) as w:
        _broken("r1", True)
        flows.start("fixable", execution_id="r1")
        doc = flows.wait("r1", 20)
        assert doc["status"] == "error" and doc["error"]["step"] == "b" and ledgers("r1", STEPS) == [1, 1, 0]
        assert flowdefs.client().ttl("plaita:execution:r1") > 0
        _broken("r1", False)  # the bug is fixed
        rid = flows.retry("r1", by="ann@test")
        wait_for(lambda: rid in (flows.get("r1") or {}).get("applied_resumes", []), 20, "the restart applied")
        doc = flows.wait("r1", 20)
        assert w.terminate() == 0
    assert doc["status"] == "completed" and doc["error"] is None and ledgers("r1", STEPS) == [1, 2, 1]
    assert ledgers("r1", STEPS, "staged") == [1, 1, 1]  # the failed run of b committed nothing
    assert doc["state"]["seen_a"] == {"a": 1} and doc["results"]["a"] == {"a": 1}  # a kept, not re-run
    restarted = [e for e in doc["history"] if e["outcome"] == "restarted"]
    assert len(restarted) == 1 and restarted[0]["step"] == "b"
    assert restarted[0]["by"] == "ann@test" and restarted[0]["from_status"] == "error"
    r = flowdefs.client()
    assert r.zscore("plaita:executions:status:error", "r1") is None
    assert r.zscore("plaita:executions:status:completed", "r1") is not None


def test_kill9_during_a_restarted_step_a_new_worker_continues_it_without_rerunning_earlier_steps(
    redis_url: str, flows: FlowClient, tmp_path: Path
) -> None:
    """The restart task's worker dies in step b after the reopen: its redelivery (applied already,
    running) continues at b; a is not run again, c runs once."""
    _broken("r9", True)
    flows.start("fixable", {"hold_run": 2}, execution_id="r9")
    with worker_proc(redis_url, tmp_path, "rk", *WORKER_ARGS) as a:
        assert flows.wait("r9", 20)["status"] == "error"
        _broken("r9", False)
        rid = flows.retry("r9")
        wait_for(lambda: flowdefs.client().get("plaita:test:sleeping:r9") == "b", 20, "b running again")
        doc = flows.get("r9")
        assert doc is not None and doc["status"] == "running" and rid in doc["applied_resumes"]
        a.kill9()
    with worker_proc(redis_url, tmp_path, "rl", *WORKER_ARGS) as b:
        doc = flows.wait("r9", 30)
        assert b.terminate() == 0
    assert doc["status"] == "completed" and ledgers("r9", STEPS) == [1, 3, 1]
    assert ledgers("r9", STEPS, "staged") == [1, 1, 1]
    assert sum(e["outcome"] == "restarted" for e in doc["history"]) == 1


def test_retry_from_a_named_earlier_step_drops_its_results_and_reruns_from_there(h: Harness) -> None:
    _broken("r2", True)
    assert h.run(start("r2", "fixable"))["status"] == "error"  # type: ignore[index]
    _broken("r2", False)
    h.flows.retry("r2", "a")
    [(mid, fields)] = h.client.xrange(h.queue.streams[0])[-1:]
    import json

    body = json.loads(fields[b"payload"])
    assert body["resume_type"] == "restart" and body["from_step"] == "a"
    doc = h.run(body, message_id=mid.decode())
    assert doc is not None and doc["status"] == "completed" and ledgers("r2", STEPS) == [2, 2, 1]
    assert doc["results"]["a"] == {"a": 2}


def test_a_restart_drops_the_events_of_the_steps_that_run_again_and_keeps_the_others(h: Harness) -> None:
    """Issue 31 item 6: a retry from step S kept what S and the steps after it had published, so a
    reader took the failed run's progress for the new run's. Those events go with their results;
    the events of the steps before S stay."""
    _broken("r6", True)
    assert h.run(start("r6", "fixable", publish=True))["status"] == "error"  # type: ignore[index]
    assert h.flows.events("r6") == {"from_a": {"run": 1}, "from_b": {"run": 1}, "progress": {"step": "b"}}
    _broken("r6", False)
    doc = h.run(_restart("r6", "retry:from-b", from_step="b"))  # b and c run again, publishing nothing
    assert doc is not None and doc["status"] == "completed" and ledgers("r6", STEPS) == [1, 2, 1]
    assert h.flows.events("r6") == {"from_a": {"run": 1}}  # b's event and b's progress are gone
    doc = h.run(_restart("r6", "retry:from-a", from_step="a", force=True))
    assert doc is not None and doc["status"] == "completed" and h.flows.events("r6") == {}


def test_a_redelivered_restart_is_a_no_op(h: Harness) -> None:
    _broken("r3", True)
    h.run(start("r3", "fixable"))
    body = _restart("r3", "retry:once")
    assert h.run(body)["status"] == "error" and ledgers("r3", STEPS) == [1, 2, 0]  # type: ignore[index]
    # The same restart again (a lost ack): known by its resume id, it runs nothing.
    assert h.run(body)["status"] == "error" and ledgers("r3", STEPS) == [1, 2, 0]  # type: ignore[index]
    _broken("r3", False)
    assert h.run(_restart("r3", "retry:twice"))["status"] == "completed"  # type: ignore[index]
    assert h.run(body)["status"] == "completed" and ledgers("r3", STEPS) == [1, 3, 1]  # type: ignore[index]
    doc = h.store.get("r3")
    assert doc is not None and sum(e["outcome"] == "restarted" for e in doc["history"]) == 2


def test_a_completed_execution_needs_force(h: Harness) -> None:
    assert h.run(start("r4", "fixable"))["status"] == "completed"  # type: ignore[index]
    assert h.flows.retry("r4", "b") == ""  # done already: a no-op without force, not an error
    assert h.run(_restart("r4", "x", "b"))["status"] == "completed" and ledgers("r4", STEPS) == [1, 1, 1]  # type: ignore[index]
    doc = h.run(_restart("r4", "y", "b", force=True))
    assert doc is not None and doc["status"] == "completed" and ledgers("r4", STEPS) == [1, 2, 2]
    with pytest.raises(NotRetryable, match="never ran"):
        h.flows.retry("r4", "nope", force=True)


def test_running_or_suspended_executions_are_not_retried(h: Harness) -> None:
    h.run(start("r5", "fixable", suspend=True))
    with pytest.raises(NotRetryable, match="suspended"):
        h.flows.retry("r5")
    doc = h.run(_restart("r5", "z"))  # the worker refuses it too
    assert doc is not None and doc["status"] == "suspended" and "z" not in doc["applied_resumes"]


def test_retry_of_a_cancelled_execution_clears_its_cancel_flag_and_its_ttl(h: Harness) -> None:
    h.run(start("r6", "fixable", suspend=True))
    h.flows.cancel("r6")
    assert h.run(resume("r6", "cancel"))["status"] == "cancelled"  # type: ignore[index]
    assert h.client.ttl("plaita:execution:r6") > 0
    h.client.set("plaita:execution:cancel:r6", "1")  # a flag left behind must not cancel it again
    doc = h.run(_restart("r6", "again"))
    assert doc is not None and doc["status"] == "suspended" and doc["step"] == "b"  # b ran again and suspended
    assert h.client.exists("plaita:execution:cancel:r6") == 0
    assert h.client.ttl("plaita:execution:r6") == -1  # no retention while it lives again
    assert h.client.zscore("plaita:executions:status:cancelled", "r6") is None
    assert h.client.zscore("plaita:executions:status:suspended", "r6") is not None
    assert ledgers("r6", STEPS) == [1, 2, 0]


def test_the_keepers_recovery_retry_does_not_restart_an_ended_execution(h: Harness) -> None:
    _broken("r7", True)
    h.run(start("r7", "fixable"))
    _broken("r7", False)
    doc = h.run(resume("r7", "retry", resume_id="keeper:abc"))  # the keeper's kind of retry, late
    assert doc is not None and doc["status"] == "error" and ledgers("r7", STEPS) == [1, 1, 0]


def test_the_cli_retries_a_completed_one_only_with_force_and_shows_the_restart(
    redis_url: str, flows: FlowClient, tmp_path: Path
) -> None:
    from tests.flows.test_cli import plaita

    with worker_proc(redis_url, tmp_path, "rc", *WORKER_ARGS) as w:
        flows.start("fixable", execution_id="r8")
        assert flows.wait("r8", 20)["status"] == "completed"
        r = plaita(redis_url, "executions", "retry", "r8", "--from-step", "b")
        assert r.returncode == 0 and r.stderr == "", r.stderr  # completed: a no-op that says so
        assert r.stdout.strip().count("\n") == 0 and "nothing to retry" in r.stdout and "--force" in r.stdout
        r = plaita(redis_url, "executions", "retry", "r8", "--from-step", "b", "--force")
        assert r.returncode == 0 and "from step b" in r.stdout, r.stderr
        wait_for(lambda: ledgers("r8", STEPS) == [1, 2, 2], 20, "b and c re-run")
        flows.wait("r8", 20)
        r = plaita(redis_url, "executions", "show", "r8")
        assert r.returncode == 0 and "restarted" in r.stdout and "from completed by" in r.stdout, r.stdout
        r = plaita(redis_url, "executions", "retry", "nope")
        assert r.returncode == 1 and "no execution" in r.stderr
        assert w.terminate() == 0
