"""Fork (``FlowClient.fork``, ``plaita executions fork``): a new execution at a step of another,
the results before it copied, the original untouched; and ``retry`` of a completed execution
without force, a no-op (issue 33 item 5)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from plaita.flows.producer.client import ExecutionNotFound, FlowClient, NotForkable
from tests.flows import flowdefs, sleepdefs
from tests.flows.support import Harness, ledgers, start
from tests.flows.test_cli import plaita
from tests.flows.test_retry import STEPS, _broken
from tests.flows.test_sleep import WORKER_ARGS
from tests.support.lease_workers import worker_proc

pytestmark = pytest.mark.redis


@pytest.fixture
def h(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    monkeypatch.setenv("PLAITA_TEST_REDIS_URL", redis_url)
    harness = Harness(redis_url, flows=[*flowdefs.FLOWS, *sleepdefs.FLOWS])
    try:
        yield harness
    finally:
        harness.close()


def _last_body(h: Harness) -> tuple[str, dict[str, object]]:
    [(mid, fields)] = h.client.xrange(h.queue.streams[0])[-1:]
    return mid.decode(), json.loads(fields[b"payload"])


def _raw(h: Harness, eid: str) -> bytes | None:
    value = h.client.get(f"plaita:execution:{eid}")
    return value if isinstance(value, bytes) else None


def test_a_fork_runs_from_its_step_with_the_earlier_results_and_leaves_the_original_as_it_was(h: Harness) -> None:
    _broken("o1", True)
    assert h.run(start("o1", "fixable", publish=True))["status"] == "error"  # type: ignore[index]
    before = _raw(h, "o1")
    assert h.flows.fork("o1", "b", "f1", by="ann@test") == "f1"
    assert h.flows.events("f1") == {"from_a": {"run": 1}}  # the events of the copied steps only
    doc = h.store.get("f1")
    assert doc is not None and doc["status"] == "running" and doc["step"] == "b"
    assert doc["results"] == {"a": {"a": 1}} and doc["forked_from"]["execution_id"] == "o1"
    assert doc["history"][0]["outcome"] == "forked" and doc["history"][0]["by"] == "ann@test"
    assert h.client.zscore("plaita:executions:status:running", "f1") is not None
    mid, body = _last_body(h)
    assert body["type"] == "start" and body["execution_id"] == "f1"
    doc = h.run(body, message_id=mid)  # b is still broken for o1 only: the fork's b runs clean
    assert doc is not None and doc["status"] == "completed", doc
    assert ledgers("f1", STEPS) == [0, 1, 1]  # a was not run again: its result came with the fork
    assert doc["results"]["c"]["seen_a"] == {"a": 1} and doc["results"]["b"] == {"b": 1}
    assert _raw(h, "o1") == before  # the original untouched
    assert h.flows.events("f1") == {"from_a": {"run": 1}, "from_b": {"run": 1}, "progress": {"step": "b"}}
    assert h.flows.events("o1") == {"from_a": {"run": 1}, "from_b": {"run": 1}, "progress": {"step": "b"}}
    assert h.run(body, message_id=mid)["status"] == "completed"  # type: ignore[index]  # a redelivery: a no-op
    assert ledgers("f1", STEPS) == [0, 1, 1]


def test_a_fork_of_a_completed_execution_from_its_first_step_runs_every_step(h: Harness) -> None:
    assert h.run(start("o2", "fixable"))["status"] == "completed"  # type: ignore[index]
    eid = h.flows.fork("o2", "a")
    assert eid != "o2" and h.store.get(eid)["results"] == {}  # type: ignore[index]
    mid, body = _last_body(h)
    doc = h.run(body, message_id=mid)
    assert doc is not None and doc["status"] == "completed" and ledgers(eid, STEPS) == [1, 1, 1]
    assert h.store.get("o2")["status"] == "completed" and ledgers("o2", STEPS) == [1, 1, 1]  # type: ignore[index]


def test_a_fork_is_refused_for_a_step_never_run_a_taken_id_or_an_unknown_execution(h: Harness) -> None:
    _broken("o3", True)
    h.run(start("o3", "fixable"))
    with pytest.raises(NotForkable, match="never ran"):
        h.flows.fork("o3", "c")
    with pytest.raises(NotForkable, match="exists already"):
        h.flows.fork("o3", "b", "o3")
    with pytest.raises(ExecutionNotFound):
        h.flows.fork("nobody", "a")
    with pytest.raises(ValueError):
        h.flows.fork("o3", "b", "")
    assert h.client.exists("plaita:execution:") == 0


def test_a_fork_at_a_step_the_flow_no_longer_has_ends_in_error(h: Harness) -> None:
    h.run(start("o4", "fixable"))
    h.flows.fork("o4", "b", "f4")
    mid, body = _last_body(h)
    raw = json.loads(_raw(h, "f4") or b"{}")
    raw["step"] = "gone"  # as if the definition had dropped it since
    h.client.set("plaita:execution:f4", json.dumps(raw))
    doc = h.run(body, message_id=mid)
    assert doc is not None and doc["status"] == "error" and doc["error"]["type"] == "UnknownStep"


def test_retry_of_a_completed_execution_without_force_is_a_no_op(h: Harness) -> None:
    assert h.run(start("o5", "fixable"))["status"] == "completed"  # type: ignore[index]
    length = h.client.xlen(h.queue.streams[0])
    assert h.flows.retry("o5") == ""
    assert h.client.xlen(h.queue.streams[0]) == length  # nothing enqueued


def test_fork_and_retry_from_the_cli_with_a_worker(
    redis_url: str, flows: FlowClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PLAITA_TEST_REDIS_URL", redis_url)
    with worker_proc(redis_url, tmp_path, "fk", *WORKER_ARGS):
        _broken("o6", True)
        flows.start("fixable", execution_id="o6")
        assert flows.wait("o6", 20)["status"] == "error"
        r = plaita(redis_url, "executions", "fork", "o6", "--from-step", "b", "--new-id", "f6", "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout) == {"execution_id": "f6", "forked_from": "o6", "from_step": "b"}
        doc = flows.wait("f6", 20)
        assert doc["status"] == "completed" and ledgers("f6", STEPS) == [0, 1, 1]
        r = plaita(redis_url, "executions", "retry", "f6")
        assert r.returncode == 0 and "nothing to retry" in r.stdout, r.stdout + r.stderr
        r = plaita(redis_url, "executions", "fork", "o6", "--from-step", "zz")
        assert r.returncode == 1 and "never ran" in r.stderr and "Traceback" not in r.stderr
        r = plaita(redis_url, "executions", "fork", "o6")
        assert r.returncode == 2 and "--from-step" in r.stderr
    assert flows.get("o6")["status"] == "error"  # type: ignore[index]
