"""What a step produces is checked before anything is written: a refused staged write, a result or
state that is not strict JSON, an absurd suspension timeout is a failed attempt of the step (its
retry policy, then ``error`` naming the cause), never a half checkpoint, a redelivery or a stuck
``running``. Plus the execution guarantees a one-line bug would break (redelivered starts, lease
loss at a step boundary). Real Redis, real leases, one task at a time through a FlowRunner."""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest

from plaita.errors import BadTaskError, ConfigError
from plaita.flows import Flow, FlowRunner, LeaseLostError, StepContext
from plaita.store.keyspace import DEADLINES_KEY, DEFAULT
from tests.flows import flowdefs
from tests.flows.support import Harness, harness, ledgers, resume, start

pytestmark = pytest.mark.redis

FAST = {"max_attempts": 2, "base_s": 0.01, "cap_s": 0.02}

half = Flow("half")


@half.step(**FAST)
def write(ctx: StepContext) -> dict[str, Any]:
    flowdefs.client().incr(f"runs:{ctx.execution_id}")
    if ctx.params.get("fix_on_retry") and ctx.attempt == 2:
        flowdefs.client().delete("app:list")  # an operator fixed the key between the attempts
    ctx.stage_incr("app:good1")
    bad = ctx.params["bad"]
    if bad == "list":
        ctx.stage_incr("app:list")
    elif bad == "ttl":
        ctx.stage("app:ttl", "v", ttl_s=10**19)
    elif bad == "amount":
        ctx.stage_incr("app:big", 10**30)
    elif bad == "text-then-incr":
        ctx.stage("app:t", "abc")
        ctx.stage_incr("app:t")
    ctx.stage_incr("app:good2")
    return {"wrote": True}


@half.step
def after(ctx: StepContext) -> None:
    ctx.stage_incr("app:after")


outputs = Flow("outputs")


@outputs.step(**FAST)
def produce(ctx: StepContext) -> Any:
    flowdefs.client().incr(f"runs:{ctx.execution_id}")
    ctx.stage_incr("app:produced")
    kind = ctx.params["kind"]
    if kind == "when":
        ctx.state["when"] = datetime.now()
        return None
    if kind == "suspend":
        return ctx.suspend(timeout_s=float(ctx.params["timeout_s"]))
    if kind == "bloat":
        return {"blob": "x" * 20_000}
    return {"x": float(kind)}  # nan, inf, -inf


FLOWS = [half, outputs]


@pytest.fixture
def h(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    monkeypatch.setenv("PLAITA_TEST_REDIS_URL", redis_url)
    with harness(redis_url) as h:
        h.runner.close()
        h.runner = FlowRunner([*flowdefs.FLOWS, *FLOWS], h.store, max_state_bytes=10_000)
        yield h


def strict(raw: Any) -> dict[str, Any]:
    def refuse(name: str) -> None:
        raise AssertionError(f"{name} stored in an execution document")

    doc = json.loads(raw, parse_constant=refuse)
    assert isinstance(doc, dict)
    return doc


def stored(h: Harness, eid: str) -> dict[str, Any]:
    return strict(h.client.get(DEFAULT.execution_key(eid)))


def runs(h: Harness, eid: str) -> int:
    return int(h.client.get(f"runs:{eid}") or 0)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("bad", "kind", "named"),
    [
        ("list", "StagedWriteRefused", "app:list"),
        ("ttl", "ValueError", "'app:ttl': ttl_s"),
        ("amount", "ValueError", "'app:big': the increment"),
        ("text-then-incr", "StagedWriteRefused", "app:t"),
    ],
)
def test_a_refused_staged_write_fails_the_step_and_writes_nothing(h: Harness, bad: str, kind: str, named: str) -> None:
    h.client.rpush("app:list", "x")
    doc = h.run(start("h1", "half", bad=bad))  # returns: no exception reaches the worker (no redelivery)
    assert doc is not None and doc["status"] == "error"
    assert doc["error"]["type"] == kind and named in doc["error"]["message"], doc["error"]
    assert doc["error"]["attempts"] == 2 and runs(h, "h1") == 2
    assert [e["outcome"] for e in doc["history"]] == ["failed", "error"]
    assert doc["state"] == {} and "write" not in doc["results"] and doc["step"] == "write"
    for key in ("app:good1", "app:good2", "app:ttl", "app:big", "app:t", "app:after"):
        assert h.client.exists(key) == 0, key
    assert h.client.lrange("app:list", 0, -1) == [b"x"]
    assert h.client.zscore(DEFAULT.status_key(0, "error"), "h1") is not None
    assert h.client.zscore(DEFAULT.status_key(0, "running"), "h1") is None


def test_a_staged_write_refused_once_lands_exactly_once_on_the_retry(h: Harness) -> None:
    h.client.rpush("app:list", "x")
    doc = h.run(start("h2", "half", bad="list", fix_on_retry=True))
    assert doc is not None and doc["status"] == "completed", doc.get("error")
    assert [e["outcome"] for e in doc["history"]] == ["failed", "ok", "ok"]
    assert [h.client.get(k) for k in ("app:good1", "app:list", "app:good2", "app:after")] == [b"1"] * 4


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_a_non_finite_result_fails_the_step_and_is_never_stored(h: Harness, value: str) -> None:
    doc = h.run(start("n1", "outputs", kind=value))
    assert doc is not None and doc["status"] == "error" and doc["error"]["type"] == "NotSerializable"
    assert "'x'" in doc["error"]["message"] and runs(h, "n1") == 2
    stored(h, "n1")  # strict JSON: no NaN or Infinity anywhere
    assert h.client.exists("app:produced") == 0


def test_in_place_state_that_is_not_json_ends_in_error_after_the_retries(h: Harness) -> None:
    doc = h.run(start("w1", "outputs", kind="when"))
    assert doc is not None and doc["status"] == "error", doc
    assert doc["error"]["type"] == "NotSerializable" and "ctx.state['when']" in doc["error"]["message"]
    assert runs(h, "w1") == 2 and doc["state"] == {}
    assert h.client.zscore(DEFAULT.status_key(0, "running"), "w1") is None
    assert h.client.exists("app:produced") == 0


@pytest.mark.parametrize("timeout_s", ["nan", "inf", "1e308", "-1", str(11 * 365 * 24 * 3600)])
def test_an_absurd_suspend_timeout_fails_the_step(h: Harness, timeout_s: str) -> None:
    doc = h.run(start("t1", "outputs", kind="suspend", timeout_s=timeout_s))
    assert doc is not None and doc["status"] == "error" and doc["error"]["type"] == "ValueError"
    assert "timeout_s" in doc["error"]["message"] and doc["suspension"] is None
    assert h.client.zscore(DEADLINES_KEY, "t1") is None and h.client.exists("app:produced") == 0
    stored(h, "t1")


def test_a_sane_suspend_timeout_is_stored_with_its_deadline(h: Harness) -> None:
    doc = h.run(start("t2", "outputs", kind="suspend", timeout_s="3600"))
    assert doc is not None and doc["status"] == "suspended"
    deadline = h.client.zscore(DEADLINES_KEY, "t2")
    assert deadline is not None and math.isclose(deadline, doc["suspension"]["deadline"], abs_tol=0.01)
    assert 3500 < deadline - time.time() <= 3600
    assert h.client.get("app:produced") == b"1"


def test_a_state_over_the_limit_commits_none_of_the_steps_staged_writes(h: Harness) -> None:
    doc = h.run(start("b1", "outputs", kind="bloat"))
    assert doc is not None and doc["status"] == "error" and doc["error"]["type"] == "StateTooLarge"
    assert h.client.exists("app:produced") == 0


def test_params_and_resume_data_that_are_not_strict_json_are_refused(h: Harness) -> None:
    with pytest.raises(ValueError, match="strict JSON"):
        h.flows.start("ledger3", {"x": math.nan})
    with pytest.raises(BadTaskError, match="strict JSON"):  # a producer other than FlowClient
        h.run({**start("j1"), "params": {"x": math.inf}})
    assert h.store.get("j1") is None
    h.run(start("j2", "signup"))
    with pytest.raises(ValueError, match="strict JSON"):
        h.flows.resume("j2", "event", {"email": math.nan})
    before = h.client.get(DEFAULT.execution_key("j2"))
    with pytest.raises(BadTaskError, match="strict JSON"):
        h.run(resume("j2", "event", {"email": math.nan}))
    assert h.client.get(DEFAULT.execution_key("j2")) == before
    assert h.client.xlen(h.queue.stream) == 0


def test_a_redelivered_start_of_a_suspended_execution_changes_nothing(h: Harness, redis_url: str) -> None:
    h.run(start("r1", "signup"))
    before = h.client.get(DEFAULT.execution_key("r1"))
    assert strict(before)["status"] == "suspended"
    h.run(start("r1", "signup"))
    changed = Flow("signup")  # a worker whose signup flow differs: the duplicate is still a no-op
    for name in ("create", "wait_for_email", "finish"):
        changed.step(name=name)(lambda ctx: None)
    with harness(redis_url) as other:
        other.runner.close()
        other.runner = FlowRunner([changed], other.store)
        other.run(start("r1", "signup"))
    assert h.client.get(DEFAULT.execution_key("r1")) == before
    assert ledgers("r1", ["create", "wait_email"]) == [1, 1]
    doc = h.run(resume("r1", "event", "a@b.c"))
    assert doc is not None and doc["status"] == "completed" and doc["state"]["email"] == "a@b.c"


def test_no_step_runs_after_the_lease_is_lost_at_a_step_boundary(h: Harness) -> None:
    task, lease = h.task(start("l1", sleep_step="one", sleep_s=30))
    failure: list[BaseException] = []

    def run() -> None:
        try:
            h.runner(task)
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    deadline_s = time.monotonic() + 10
    while h.client.get("plaita:test:sleeping:l1") is None and time.monotonic() < deadline_s:
        time.sleep(0.01)
    task.cancelled.set()  # the renewer gave up on the lease (the key itself may still be there)
    thread.join(10)
    h.leases.release(lease)
    assert not thread.is_alive() and len(failure) == 1 and isinstance(failure[0], LeaseLostError), failure
    assert ledgers("l1", ["one", "two", "three"]) == [1, 0, 0]


def test_a_state_stored_with_nan_before_json_was_strict_ends_in_error_not_a_loop(h: Harness) -> None:
    h.run(start("g1", "signup"))
    legacy = stored(h, "g1")
    legacy["state"]["score"] = math.nan
    h.client.set(DEFAULT.execution_key("g1"), json.dumps(legacy))  # what an older plaita wrote
    doc = h.run(resume("g1", "event", "a@b.c"))  # returns: the error is written, no redelivery
    assert doc is not None and doc["status"] == "error" and doc["error"]["type"] == "NotSerializable"
    assert "ctx.state['score']" in doc["error"]["message"]
    stored(h, "g1")


def test_a_retention_redis_cannot_expire_is_refused_at_start_up(h: Harness) -> None:
    with pytest.raises(ConfigError, match="retention_s"):
        FlowRunner(FLOWS, h.store, retention_s=10**19)


def test_an_orphan_stored_with_nan_is_marked_in_strict_json(h: Harness) -> None:
    doc = {"execution_id": "o1", "status": "running", "state": {"score": math.nan}, "params": {}}
    h.client.set(DEFAULT.execution_key("o1"), json.dumps(doc))
    h.client.zadd(DEFAULT.status_key(0, "running"), {"o1": 100.0})
    assert h.store.mark_orphaned("o1", 100.0, {"type": "Orphaned"}, time.time(), 3600)
    marked = stored(h, "o1")
    assert marked["status"] == "error" and marked["error"] == {"type": "Orphaned"}


def _ctx() -> StepContext:
    from plaita.tasks import CancelFlag

    return StepContext(
        execution_id="u1", flow_id="f", step="s", params={}, state={}, results={}, resume=None, attempt=1,
        cancel=CancelFlag(),
    )  # fmt: skip


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda c: c.stage("k", "v", ttl_s=10**19), "ttl_s"),
        (lambda c: c.stage("k", "v", ttl_s=-1), "ttl_s"),
        (lambda c: c.stage("k", "v", ttl_s=1.5), "whole number"),
        (lambda c: c.stage("k", "v", ttl_s=True), "whole number"),
        (lambda c: c.stage("k", {"x": math.nan}), "strict JSON"),
        (lambda c: c.stage_push("k", math.inf), "strict JSON"),
        (lambda c: c.stage("k", {1, 2}), "strict JSON"),
        (lambda c: c.stage_incr("k", 10**30), "64-bit"),
        (lambda c: c.stage_incr("k", 1.5), "whole number"),
        (lambda c: c.stage_incr("k", math.nan), "whole number"),
        (lambda c: c.suspend(timeout_s=math.nan), "timeout_s"),
        (lambda c: c.suspend(timeout_s=math.inf), "timeout_s"),
        (lambda c: c.suspend(timeout_s=1e308), "timeout_s"),
        (lambda c: c.suspend(timeout_s=-1), "timeout_s"),
        (lambda c: c.suspend(timeout_s="60"), "timeout_s"),  # type: ignore[arg-type]
    ],
)
def test_a_bad_staged_value_or_timeout_raises_in_the_step_at_the_call(call: Any, match: str) -> None:
    ctx = _ctx()
    with pytest.raises(ValueError, match=match):
        call(ctx)
    assert ctx.staged == []


def test_sane_staged_values_and_timeouts_are_accepted() -> None:
    ctx = _ctx()
    ctx.stage("a", {"x": 1.5}, ttl_s=3600.0)
    ctx.stage_incr("b", -(2**63))
    ctx.stage_push("c", "text", ttl_s=10 * 365 * 24 * 3600)
    assert [(s.op, s.value, s.ttl_s) for s in ctx.staged] == [
        ("set", '{"x": 1.5}', 3600), ("incrby", str(-(2**63)), 0), ("rpush", "text", 10 * 365 * 24 * 3600)
    ]  # fmt: skip
    assert ctx.suspend(timeout_s=0).timeout_s == 0.0 and ctx.suspend().timeout_s is None
