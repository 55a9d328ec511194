"""The Execution alone: its stored shape, decode of every stored document, strict encode, the caps,
and each transition. Pure: no Redis."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import pytest

from plaita.flows import Flow
from plaita.flows.model.execution import (
    APPLIED_RESUMES_LIMIT,
    HISTORY_LIMIT,
    BadExecution,
    Execution,
    error_doc,
)
from plaita.flows.model.validate import StepOutputError
from plaita.flows.runner.checkpoint import sealed

#: The fields of the stored document, as every plaita version has written them (tests, old
#: executions in Redis, dashboards and jq scripts read these names).
STORED_FIELDS = {
    "execution_id",
    "flow_id",
    "fingerprint",
    "version",
    "versions",
    "status",
    "step_index",
    "step",
    "attempt",
    "params",
    "state",
    "results",
    "resume",
    "suspension",
    "history",
    "steps_run",
    "applied_resumes",
    "error",
    "dedup_key",
    "created_at",
    "updated_at",
    "ended_at",
}


def make_flow(version: str | None = "2", compatible: tuple[str, ...] = ("1",)) -> Flow:
    flow = Flow("f", version=version, compatible_with=compatible)
    for name in ("one", "two", "three"):
        flow.step(name=name)(lambda ctx: None)
    return flow


def new(**params: Any) -> Execution:
    return Execution.start("e1", make_flow(), params, dedup_key=None, now_s=100.0)


#: An execution as the code before the typed Execution wrote it: suspended once, upgraded by a
#: rolling upgrade (``versions``), with a field a newer version may add.
OLD_DOC = json.loads(
    '{"execution_id":"o1","flow_id":"f","fingerprint":"abc","version":"2","versions":["1","2"],'
    '"status":"suspended","step_index":1,"step":"two","attempt":0,"params":{"p":1},"state":{"s":2},'
    '"results":{"one":{"s":2}},"resume":null,"suspension":{"seq":1,"step":"two","since":101.0,"deadline":null},'
    '"history":[{"step":"one","attempt":1,"started_at":100.0,"ended_at":100.5,"outcome":"ok"}],'
    '"steps_run":2,"applied_resumes":["r0"],"error":null,"dedup_key":"d","created_at":100.0,'
    '"updated_at":101.0,"ended_at":null,"suspensions":1,"from_the_future":{"x":1}}'
)


def test_a_new_execution_has_exactly_the_stored_fields() -> None:
    doc = new(a=1).to_doc()
    assert set(doc) == STORED_FIELDS
    assert doc["status"] == "running" and doc["step"] == "one" and doc["step_index"] == 0
    assert doc["versions"] == ["1", "2"] and doc["params"] == {"a": 1}
    assert doc["created_at"] == doc["updated_at"] == 100.0 and doc["ended_at"] is None


def test_a_start_creates_the_started_execution_and_its_document_with_a_childs_parent() -> None:
    parent = {"execution_id": "p1", "spawn": "s", "index": 0}
    execution = Execution.start(
        "e1", make_flow(), {"p": 1}, dedup_key="d", now_s=100.0, deadline_at=160.0, parent=parent
    )
    text = execution.encode()
    assert execution.status == "running" and execution.step == "one" and execution.deadline_at == 160.0
    assert json.loads(text) == execution.to_doc() and json.loads(text)["parent"] == parent
    alone = Execution.start("e2", make_flow(), {}, dedup_key=None, now_s=100.0, deadline_at=None, parent=None)
    assert "parent" not in alone.to_doc()


def test_a_flow_has_a_limit_to_pass_only_with_a_slot_limit_or_for_a_start_a_rate() -> None:
    assert not Flow("free").limited(start=True)
    assert Flow("slots", max_concurrent=2).limited(start=False)
    rated = Flow("rated", max_starts_per_s=5.0)
    assert rated.limited(start=True) and not rated.limited(start=False)


def test_an_old_document_decodes_and_encodes_back_to_the_same_document() -> None:
    execution = Execution.decode(OLD_DOC)
    assert execution.status == "suspended" and execution.suspensions == 1 and execution.versions == ["1", "2"]
    assert execution.to_doc() == OLD_DOC, "every field, the unknown one too, is written back as it was"
    assert json.loads(execution.encode()) == OLD_DOC


def test_a_document_from_before_lineages_keeps_having_none() -> None:
    doc = {k: v for k, v in OLD_DOC.items() if k not in ("versions", "suspensions", "from_the_future")}
    execution = Execution.decode(doc)
    assert execution.versions is None and execution.suspensions == 0
    assert execution.to_doc() == doc, "no versions / suspensions invented"
    assert execution.upgraded(make_flow("3", ("2",)), 1).versions == ["2", "3"], "the lineage starts at its version"


def test_upgrade_extends_the_lineage_and_moves_to_the_new_definition() -> None:
    flow = make_flow("3", ("2",))
    up = Execution.decode(OLD_DOC).upgraded(flow, 2)
    assert (up.version, up.fingerprint, up.step_index) == ("3", flow.fingerprint, 2)
    assert up.versions == ["1", "2", "3"]


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"status": "paused"}, "unknown status"),
        ({"status": None}, "unknown status"),
        ({"step_index": "x"}, "malformed"),
    ],
)
def test_a_document_plaita_never_wrote_is_a_bad_execution(change: dict[str, Any], why: str) -> None:
    with pytest.raises(BadExecution, match=why):
        Execution.decode({**OLD_DOC, **change})


def test_transitions_return_a_new_execution_and_leave_the_old_one_alone() -> None:
    before = new()
    after = before.retrying("one", 1, 100.0, 101.0, "ValueError: x")
    assert before.history == [] and before.attempt == 0 and before.steps_run == 0
    assert after.attempt == 1 and after.steps_run == 1 and after.history[0]["outcome"] == "failed"
    with pytest.raises(AttributeError):
        after.status = "completed"  # type: ignore[misc]


def test_changed_is_what_dataclasses_replace_gives_and_refuses_what_it_refuses() -> None:
    before = Execution.decode(OLD_DOC)
    changes: dict[str, Any] = {"status": "running", "attempt": 2, "extra": {"y": 2}}
    after = before.changed(**changes)
    assert after == dataclasses.replace(before, **changes) and after.extra == {"y": 2}
    assert after.to_doc() == dataclasses.replace(before, **changes).to_doc()
    assert list(after.to_doc()) == list(dataclasses.replace(before, **changes).to_doc())  # same field order
    assert before.status == "suspended" and before.attempt == 0  # the old one is left alone
    with pytest.raises(TypeError, match="no field 'nope'"):
        before.changed(nope=1)
    with pytest.raises(BadExecution, match="unknown status"):
        before.changed(status="bogus")
    with pytest.raises(AttributeError):
        after.status = "completed"  # type: ignore[misc]


def test_step_done_merges_a_dict_result_into_the_state_and_moves_on() -> None:
    ex = new().step_done("one", {"a": 1}, {"z": 0}, (1, "two"), 1, 100.0, 101.0)
    assert (ex.status, ex.step_index, ex.step, ex.attempt) == ("running", 1, "two", 0)
    assert ex.state == {"z": 0, "a": 1} and ex.results == {"one": {"a": 1}}
    ex = ex.step_done("two", 7, {"z": 0, "a": 1}, None, 1, 102.0, 103.0)
    assert ex.status == "completed" and ex.ended_at == 103.0
    assert ex.state == {"z": 0, "a": 1} and ex.results == {"one": {"a": 1}, "two": 7}, "a non-dict result is not merged"
    assert [h["outcome"] for h in ex.history] == ["ok", "ok"] and ex.steps_run == 2


def test_suspend_then_resume() -> None:
    ex = new().suspended("one", {"s": 1}, 1, 100.0, 101.0, 161.0)
    assert ex.status == "suspended" and ex.suspensions == 1
    assert ex.suspension == {"seq": 1, "step": "one", "since": 101.0, "deadline": 161.0}
    assert not ex.stale_timeout(None) and not ex.stale_timeout(1) and ex.stale_timeout(2)
    back = ex.resumed("event", {"ok": True}, "r1")
    assert (
        back.status == "running" and back.suspension is None and back.resume == {"type": "event", "data": {"ok": True}}
    )
    assert back.applied_resumes == ["r1"] and back.stale_timeout(None), "a timeout of an ended suspension is stale"
    assert back.suspended("one", {}, 1, 102.0, 103.0, None).suspension["seq"] == 2  # type: ignore[index]


def test_failed_and_ended() -> None:
    err = error_doc("one", "Boom", "it broke")
    ex = new().failed("one", 3, 100.0, 101.0, "Boom: it broke", err)
    assert (ex.status, ex.attempt, ex.error, ex.ended_at) == ("error", 3, err, 101.0) and ex.terminal
    assert ex.history[-1] == {
        "step": "one",
        "attempt": 3,
        "started_at": 100.0,
        "ended_at": 101.0,
        "outcome": "error",
        "error": "Boom: it broke",
    }
    cancelled = new().ended("cancelled", 105.0)
    assert cancelled.status == "cancelled" and cancelled.ended_at == 105.0 and cancelled.error is None


def test_history_keeps_the_newest_entries_and_steps_run_keeps_counting() -> None:
    ex = new()
    for attempt in range(1, HISTORY_LIMIT + 6):
        ex = ex.retrying("one", attempt, float(attempt), float(attempt), "x")
    assert len(ex.history) == HISTORY_LIMIT and ex.steps_run == HISTORY_LIMIT + 5
    assert ex.history[0]["attempt"] == 6 and ex.history[-1]["attempt"] == HISTORY_LIMIT + 5
    longer = Execution.decode({**OLD_DOC, "history": [{"n": i} for i in range(HISTORY_LIMIT + 3)]})
    assert len(longer.history) == HISTORY_LIMIT and longer.history[-1] == {"n": HISTORY_LIMIT + 2}


def test_applied_resumes_remember_the_newest() -> None:
    ex = new().suspended("one", {}, 1, 0.0, 0.0, None)
    for n in range(APPLIED_RESUMES_LIMIT + 2):
        ex = ex.resumed("event", None, f"r{n}").suspended("one", {}, 1, 0.0, 0.0, None)
    assert (
        len(ex.applied_resumes) == APPLIED_RESUMES_LIMIT and ex.applied_resumes[-1] == f"r{APPLIED_RESUMES_LIMIT + 1}"
    )
    assert "r0" not in ex.applied_resumes and "r1" not in ex.applied_resumes


def test_encode_is_strict_json() -> None:
    with pytest.raises(ValueError):
        new(x=math.nan).encode()
    assert "NaN" not in new(x=1.5).encode()


def test_seal_a_step_output_that_is_not_json_is_the_steps_failure() -> None:
    ex = new().step_done("one", {"bad": math.inf}, {}, (1, "two"), 1, 0.0, 1.0)
    with pytest.raises(StepOutputError, match="'bad'"):
        sealed(ex, 10_000, "one", output=True)


def test_seal_a_stored_state_that_is_not_json_ends_in_error_without_it() -> None:
    ex = Execution.decode({**OLD_DOC, "status": "running", "state": {"n": math.nan}}).stamped(200.0)
    written, text = sealed(ex, 10_000, None, output=False)
    assert written.status == "error" and written.state == {} and written.results == {}
    assert written.ended_at == 200.0 and written.error is not None and written.error["type"] == "NotSerializable"
    assert json.loads(text) == written.to_doc()


def test_seal_a_state_over_the_limit_becomes_a_small_error() -> None:
    ex = new().step_done("one", {"blob": "x" * 5000}, {}, (1, "two"), 1, 0.0, 1.0)
    written, text = sealed(ex, 2000, "one", output=True)
    assert written.status == "error" and written.state == {} and written.results == {} and len(text) < 2000
    assert written.error is not None and written.error["type"] == "StateTooLarge"
    assert "after step 'one'" in written.error["message"]
    same, _ = sealed(ex, 20_000, "one", output=True)
    assert same is ex, "under the limit: written as it is"


def test_seal_an_error_over_the_limit_is_written_anyway() -> None:
    ex = new(blob="x" * 5000).failed("one", 1, 0.0, 1.0, "x", error_doc("one", "Boom", "x"))
    written, text = sealed(ex, 2000, "one", output=False)
    assert written is ex and len(text) > 2000, "the record of the failure is not replaced"


def test_queued_and_start_build_what_the_dataclass_init_builds_with_every_field_in_order() -> None:
    """``queued`` (and ``start`` from it) and ``decode`` fill the instance's dict without ``__init__``: the
    same fields, values and order (``to_doc`` copies that dict in field order)."""
    names = [f.name for f in dataclasses.fields(Execution)]
    queued = Execution.queued("q1", "f", {"p": 1}, dedup_key="k", version="v1", now_s=5.0, due=(7000, "t-1"))
    assert list(queued.__dict__) == names
    assert queued == Execution(**{n: getattr(queued, n) for n in names}) and queued.extra == {}
    flow = Flow("f")
    flow.step(lambda ctx: None, name="a")
    started = Execution.start("s1", flow, {}, dedup_key=None, now_s=5.0, parent={"id": "p"})
    assert list(started.__dict__) == names and started.status == "running" and started.extra == {"parent": {"id": "p"}}
    decoded = Execution.decode(json.loads(started.encode()))  # decode fills it the same way
    assert list(decoded.__dict__) == names and decoded == started and decoded.extra == started.extra
    assert list(started.to_doc()) == [
        n for n in names if n not in ("suspensions", "deadline_at", "inbox", "waiting", "extra")
    ] + ["parent"]
