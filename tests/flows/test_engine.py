"""The flow engine on real Redis, one task at a time under a real lease (no worker)."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest

from plaita.errors import BadTaskError, ConfigError
from plaita.flows import Flow, FlowRunner, LeaseLostError, load_flows
from plaita.flows.model.execution import Execution
from plaita.store.executions.execution_io import checkpoint_now, create_now
from plaita.store.keyspace import DEFAULT
from plaita.store.leases import Lease
from tests.flows import flowdefs
from tests.flows.support import Harness, harness, ledgers, resume, start

pytestmark = pytest.mark.redis

STEPS = ["one", "two", "three"]


def test_three_steps_complete_with_state_history_and_index(h: Harness) -> None:
    doc = h.run(start("e1"))
    assert doc is not None and doc["status"] == "completed"
    assert doc["state"] == {"one": 1, "two": 2, "three": 3}
    assert [e["step"] for e in doc["history"]] == STEPS
    assert all(e["outcome"] == "ok" and e["ended_at"] >= e["started_at"] for e in doc["history"])
    assert ledgers("e1", STEPS) == [1, 1, 1] and ledgers("e1", STEPS, "staged") == [1, 1, 1]
    assert h.client.zscore(DEFAULT.status_key(0, "completed"), "e1") is not None
    assert h.client.zscore(DEFAULT.status_key(0, "running"), "e1") is None
    ttl = h.client.ttl("plaita:execution:e1")
    assert 6 * 24 * 3600 < int(ttl) <= 7 * 24 * 3600  # type: ignore[arg-type]


def test_duplicate_start_is_a_no_op(h: Harness) -> None:
    h.run(start("e2"))
    doc = h.run(start("e2"))
    assert doc is not None and doc["steps_run"] == 3
    assert ledgers("e2", STEPS) == [1, 1, 1]


def test_dedup_key_starts_one_execution(h: Harness) -> None:
    h.run({**start("d1"), "dedup_key": "order-7"})
    h.run({**start("d2"), "dedup_key": "order-7"})
    assert h.store.get("d2") is None
    assert h.store.dedup_target("order-7") == "d1"
    assert ledgers("d1", STEPS) == [1, 1, 1]


def test_suspend_then_resume_with_data(h: Harness) -> None:
    doc = h.run(start("s1", "signup", name="bo"))
    assert doc is not None and doc["status"] == "suspended" and doc["step"] == "wait_email"
    assert h.client.zscore(DEFAULT.status_key(0, "suspended"), "s1") is not None
    doc = h.run(resume("s1", "event", {"addr": "bo@x"}), message_id="900-1")
    assert doc is not None and doc["status"] == "completed", doc
    assert doc["state"]["resumed_by"] == "event" and doc["state"]["email"] == {"addr": "bo@x"}
    assert ledgers("s1", ["create", "wait_email", "finish"]) == [1, 2, 1]


def test_duplicate_resume_is_a_no_op(h: Harness) -> None:
    h.run({**start("s2", "signup"), "params": {}})
    h.run(resume("s2", "event", "a", resume_id="hook-1"))
    doc = h.store.get("s2")
    assert doc is not None and doc["status"] == "completed"
    # The same resume again (a redelivery, or the webhook twice): nothing runs.
    h.run(resume("s2", "event", "a", resume_id="hook-1"))
    assert ledgers("s2", ["create", "wait_email", "finish"]) == [1, 2, 1]


def test_resume_already_applied_to_a_suspended_execution_is_a_no_op(h: Harness) -> None:
    """The overlap flow suspends again after every resume: the same resume id must not re-run it."""
    h.run(start("o1", "overlap", hold_s=0))
    h.run(resume("o1", "event", 1, resume_id="r1"))
    assert h.store.get("o1")["status"] == "completed"  # type: ignore[index]
    h.run(start("o2", "signup", timeout_s=100))
    h.run(resume("o2", "event", "x", resume_id="r9"))
    before = ledgers("o2", ["wait_email"])
    h.run(resume("o2", "event", "x", resume_id="r9"))
    assert ledgers("o2", ["wait_email"]) == before


def test_timeout_resume_and_stale_timeout(h: Harness) -> None:
    h.run(start("t1", "signup", timeout_s=60))
    assert h.client.zscore("plaita:executions:deadlines", "t1") is not None
    doc = h.store.get("t1")
    assert doc is not None
    seq = doc["suspension"]["seq"]
    # A timeout for some other (older) suspension is stale: ignored.
    h.run(resume("t1", "timeout", suspension=seq + 5))
    assert h.store.get("t1")["status"] == "suspended"  # type: ignore[index]
    doc = h.run(resume("t1", "timeout", suspension=seq))
    assert doc is not None and doc["status"] == "completed" and doc["state"]["resumed_by"] == "timeout"
    assert h.client.zscore("plaita:executions:deadlines", "t1") is None


def test_cancel_of_a_suspended_execution(h: Harness) -> None:
    h.run(start("c1", "signup"))
    h.flows.cancel("c1")
    doc = h.run(resume("c1", "cancel"))
    assert doc is not None and doc["status"] == "cancelled"
    assert ledgers("c1", ["finish"]) == [0]
    assert h.client.exists("plaita:execution:cancel:c1") == 0


def test_cancel_flag_is_honoured_at_the_next_step_boundary_and_seen_by_a_long_step(h: Harness) -> None:
    def cancel_soon() -> None:
        deadline = time.monotonic() + 5
        while h.client.get("plaita:test:sleeping:p1") is None and time.monotonic() < deadline:
            time.sleep(0.01)
        h.store.request_cancel("p1")

    t = threading.Thread(target=cancel_soon)
    t.start()
    started = time.monotonic()
    doc = h.run(start("p1", "patient", wait_s=10))
    t.join()
    assert time.monotonic() - started < 5  # the step saw its flag long before its 10 s wait
    assert doc is not None and doc["status"] == "cancelled"
    assert h.client.get("plaita:test:saw-cancel:p1") == b"1"
    assert ledgers("p1", ["linger", "after"]) == [1, 0]


def test_retries_then_success_and_budget_then_error(h: Harness) -> None:
    doc = h.run(start("f1", "flaky", fail_times=2))
    assert doc is not None and doc["status"] == "completed" and doc["state"]["attempt"] == 3
    assert [e["outcome"] for e in doc["history"]] == ["failed", "failed", "ok"]
    doc = h.run(start("f2", "flaky", fail_times=5))
    assert doc is not None and doc["status"] == "error"
    assert doc["error"]["type"] == "RuntimeError" and doc["error"]["attempts"] == 3
    assert "flaky failure 3" in doc["error"]["traceback"]
    assert ledgers("f2", ["wobble"]) == [3]
    assert h.client.zscore(DEFAULT.status_key(0, "error"), "f2") is not None


def test_non_retryable_error_ends_at_once(h: Harness) -> None:
    doc = h.run(start("f3", "flaky", fatal=True))
    assert doc is not None and doc["status"] == "error" and doc["error"]["type"] == "NonRetryableError"
    assert ledgers("f3", ["wobble"]) == [1]


def test_goto_loops_with_a_checkpoint_per_step(h: Harness) -> None:
    doc = h.run(start("l1", "loop", times=4))
    assert doc is not None and doc["status"] == "completed" and doc["state"]["n"] == 4
    assert [e["step"] for e in doc["history"]] == ["tick"] * 4 + ["tock"]


def test_unserialisable_result_ends_in_error_not_dlq(h: Harness) -> None:
    doc = h.run(start("b1", "bad_result"))
    assert doc is not None and doc["status"] == "error" and doc["error"]["type"] == "NotSerializable"


def test_state_over_the_limit_ends_in_error(redis_url: str) -> None:
    with harness(redis_url, max_state_bytes=10_000) as h:
        doc = h.run(start("g1", "big", size=20_000))
        assert doc is not None and doc["status"] == "error" and doc["error"]["type"] == "StateTooLarge"
        with pytest.raises(BadTaskError, match="limit"):
            h.run(start("g2", "big", pad="y" * 20_000))


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ({"type": "start", "flow_id": "nope", "execution_id": "x1"}, "unknown flow"),
        ({"type": "start", "flow_id": "ledger3", "execution_id": "x2", "params": [1]}, "JSON object"),
        ({"type": "resume", "execution_id": "ghost", "resume_type": "event"}, "unknown execution"),
    ],
)
def test_bad_input_raises_bad_task_error(h: Harness, body: dict[str, object], reason: str) -> None:
    with pytest.raises(BadTaskError, match=reason):
        h.run(body)


@pytest.mark.parametrize("raw", ["garbage{", "[1, 2]", "\xff\xfe", '{"flow_id": "ledger3", "status": "paused"}'])
@pytest.mark.parametrize("kind", ["start", "resume"])
def test_a_task_of_an_unreadable_execution_is_a_bad_task_naming_the_key(h: Harness, raw: str, kind: str) -> None:
    """A corrupt execution key dead-letters the task with the key in the reason (one delivery), is
    never a failed delivery retried --max-deliveries times, and is left as it was for an operator."""
    eid = f"corrupt-{kind}-{len(raw)}"
    key = f"plaita:execution:{eid}"
    h.client.set(key, raw.encode("latin-1"))
    body = start(eid) if kind == "start" else resume(eid, "continue")
    with pytest.raises(BadTaskError, match=f"{eid}.*unreadable.*{key}"):
        h.run(body)
    assert h.client.get(key) == raw.encode("latin-1")


def test_resume_of_another_flows_execution_and_bad_resume_type(h: Harness) -> None:
    h.run(start("s5", "signup"))
    with pytest.raises(BadTaskError, match="runs flow 'signup'"):
        h.run({**resume("s5"), "flow_id": "ledger3"})
    with pytest.raises(BadTaskError, match="resume_type"):
        h.run(resume("s5", "poke"))
    assert h.store.get("s5")["status"] == "suspended"  # type: ignore[index]


def test_stale_generation_checkpoint_is_refused(h: Harness) -> None:
    task, lease = h.task(start("z1", "signup"))
    h.leases.release(lease)
    newer = h.leases.acquire("z1")  # a successor took the lease: generation + 1
    assert isinstance(newer, Lease) and newer.generation == lease.generation + 1
    with pytest.raises(LeaseLostError):
        h.runner(task)
    assert h.store.get("z1") is None
    ok, _ = checkpoint_now(h.store, "z1", lease.generation, "{}", status="running", now_s=time.time())
    assert not ok


def test_flow_changed_is_refused_unless_a_compatible_version(h: Harness, redis_url: str) -> None:
    h.run(start("v1", "signup"))
    changed = Flow("signup")
    for name in ("create", "verify", "wait_email", "finish"):
        changed.step(name=name)(lambda ctx: None)
    with harness(redis_url) as h2:
        h2.runner = FlowRunner([changed], h2.store)
        doc = h2.run(resume("v1", "event", "x"))
    assert doc is not None and doc["status"] == "error" and doc["error"]["type"] == "FlowChanged"

    h.run(start("v2", "signup"))
    doc = h.store.get("v2")
    assert doc is not None
    doc["version"] = "1"
    h.client.set("plaita:execution:v2", json.dumps(doc))
    compatible = Flow("signup", version="2", compatible_with=("1",))
    for name in ("create", "verify", "wait_email", "finish"):
        compatible.step(name=name)(lambda ctx: None)
    with harness(redis_url) as h3:
        h3.runner = FlowRunner([compatible], h3.store)
        doc = h3.run(resume("v2", "event", "x"))
    assert doc is not None and doc["status"] == "completed" and doc["step"] == "finish"


def test_load_flows(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = load_flows(["tests.flows.flowdefs"])
    assert registry.get("ledger3") is not None and len(registry) == len(flowdefs.FLOWS) == 11
    with pytest.raises(ConfigError, match="cannot import"):
        load_flows(["tests.flows.no_such_module"])
    with pytest.raises(ConfigError, match="no Flow"):
        load_flows(["json"])


def test_run_async_runs_on_the_callers_loop(h: Harness) -> None:
    task, lease = h.task(start("a1"))
    asyncio.run(h.runner.run_async(task))
    h.leases.release(lease)
    assert h.store.get("a1")["status"] == "completed"  # type: ignore[index]


def test_cancel_requested_before_the_start_runs_no_step(h: Harness) -> None:
    h.store.request_cancel("early")
    doc = h.run(start("early"))
    assert doc is not None and doc["status"] == "cancelled" and doc["history"] == []
    assert ledgers("early", STEPS) == [0, 0, 0]


def test_redelivered_start_of_a_running_execution_continues_at_its_step(h: Harness) -> None:
    """A worker died after step one's checkpoint: the start's redelivery runs two and three only."""
    flow = h.runner.flows.get("ledger3")
    assert flow is not None
    doc = Execution.start("re1", flow, {}, dedup_key=None, now_s=time.time()).to_doc()
    doc.update(step_index=1, step="two", state={"one": 1})
    task, lease = h.task(start("re1"))
    code, _, _ = create_now(h.store, "re1", lease.generation, json.dumps(doc), doc["created_at"], None)
    h.leases.release(lease)
    assert code == 1
    doc = h.run(start("re1"))
    assert doc is not None and doc["status"] == "completed" and doc["state"]["three"] == 3
    assert ledgers("re1", STEPS) == [0, 1, 1]


def test_scripts_are_reloaded_after_the_server_lost_its_script_cache(h: Harness) -> None:
    h.run(start("n1"))
    h.client.script_flush()  # as after a Redis restart: every EVALSHA answers NOSCRIPT once
    doc = h.run(start("n2"))
    assert doc is not None and doc["status"] == "completed" and ledgers("n2", STEPS) == [1, 1, 1]


def test_sync_step_may_use_asyncio_run_and_async_steps_share_the_thread_loop(h: Harness) -> None:
    doc = h.run(start("m1", "mixed"))
    assert doc is not None and doc["status"] == "completed", doc and doc.get("error")
    assert doc["state"]["answer"] == 42
    task, lease = h.task(start("m2", "mixed"))
    asyncio.run(h.runner.run_async(task))  # on the caller's loop, sync steps on threads
    h.leases.release(lease)
    assert h.store.get("m2")["state"]["answer"] == 42  # type: ignore[index]


def test_resume_of_a_still_running_execution_is_applied_at_its_suspension(h: Harness) -> None:
    """The worker died inside wait_email before it suspended; the event arrives first."""
    flow = h.runner.flows.get("signup")
    assert flow is not None
    doc = Execution.start("pr1", flow, {}, dedup_key=None, now_s=time.time()).to_doc()
    doc.update(step_index=1, step="wait_email", state={"user": "ann"})
    task, lease = h.task(start("pr1", "signup"))
    assert create_now(h.store, "pr1", lease.generation, json.dumps(doc), doc["created_at"], None)[0] == 1
    h.leases.release(lease)
    doc = h.run(resume("pr1", "event", "ann@x", resume_id="ev-1"))
    assert doc is not None and doc["status"] == "completed" and doc["state"]["email"] == "ann@x"
    assert "ev-1" in doc["applied_resumes"]
    assert [e["outcome"] for e in doc["history"]] == ["suspended", "resumed", "ok", "ok"]
    h.run(start("pr1", "signup"))  # the dead worker's start, redelivered at last: a no-op
    assert ledgers("pr1", ["create", "wait_email", "finish"]) == [0, 2, 1]


def test_redelivered_resume_whose_worker_died_in_a_later_step_continues(h: Harness) -> None:
    """The resume was applied and checkpointed, then its worker was killed in ``finish``: the
    redelivered resume task must carry the execution on, not ack it as a duplicate."""
    flow = h.runner.flows.get("signup")
    assert flow is not None
    doc = Execution.start("pr2", flow, {}, dedup_key=None, now_s=time.time()).to_doc()
    doc.update(step_index=2, step="finish", state={"user": "ann", "email": "a@x"}, applied_resumes=["ev-2"])
    task, lease = h.task(start("pr2", "signup"))
    assert create_now(h.store, "pr2", lease.generation, json.dumps(doc), doc["created_at"], None)[0] == 1
    h.leases.release(lease)
    doc = h.run(resume("pr2", "event", "a@x", resume_id="ev-2"))
    assert doc is not None and doc["status"] == "completed", doc
    assert ledgers("pr2", ["create", "wait_email", "finish"]) == [0, 0, 1]
    h.run(resume("pr2", "event", "a@x", resume_id="ev-2"))  # once terminal, a duplicate is a no-op
    assert ledgers("pr2", ["finish"]) == [1]
