"""Events (``ctx.publish``, ``ctx.set_progress``): written at once under the execution's lease
fence, read by ``FlowClient.events`` / ``get_event`` while the step still runs, size-limited,
strict JSON, in the execution's slot, expiring with the execution."""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from plaita.errors import LeaseLostError
from plaita.flows.model.context import StepContext
from plaita.flows.producer.client import FlowClient
from plaita.flows.runner.events import MAX_EVENT_BYTES, MAX_EVENTS, publisher
from plaita.store.client import make_client
from plaita.store.executions.store import ExecutionStore
from plaita.store.keyspace import Keyspace
from plaita.store.leases import Lease
from plaita.tasks import CancelFlag, Task
from tests.flows import deadline_flows, flowdefs
from tests.flows.support import Harness, start
from tests.flows.test_cli import plaita
from tests.support.lease_workers import wait_for

pytestmark = pytest.mark.redis


@pytest.fixture
def h(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    monkeypatch.setenv("PLAITA_TEST_REDIS_URL", redis_url)
    harness = Harness(redis_url, flows=[*flowdefs.FLOWS, *deadline_flows.FLOWS], retention_s=600)
    try:
        yield harness
    finally:
        harness.close()


def leased_task(h: Harness, eid: str) -> tuple[Task, Lease]:
    task, lease = h.task({"type": "resume", "execution_id": eid, "resume_type": "event"})
    return task, lease


def test_a_running_step_publishes_and_the_client_reads_it_before_the_step_ends(h: Harness) -> None:
    done: list[dict[str, Any] | None] = []
    runner = threading.Thread(target=lambda: done.append(h.run(start("ev1", "ticker", n=3))), daemon=True)
    runner.start()
    try:
        wait_for(lambda: h.flows.get_event("ev1", "partial") is not None, 15, "the partial result published")
        assert h.flows.get_event("ev1", "progress") == {"done": 3, "of": 3}  # the last value wins
        assert h.flows.events("ev1") == {"partial": {"rows": [1, 2, 3]}, "progress": {"done": 3, "of": 3}}
        assert h.store.get("ev1")["status"] == "running"  # type: ignore[index]
        record = h.store.event("ev1", "progress")
        assert record is not None and record["step"] == "tick" and isinstance(record["at"], float)
    finally:
        flowdefs.client().set(deadline_flows.release_key("ev1"), 1)
        runner.join(30)
    assert done and done[0] is not None and done[0]["status"] == "completed"
    assert h.flows.get_event("ev1", "partial") == {"rows": [1, 2, 3, 4], "final": True}
    assert h.flows.get_event("ev1", "missing", "none") == "none" and h.flows.events("nobody") == {}


def test_events_expire_with_the_execution(h: Harness) -> None:
    flowdefs.client().set(deadline_flows.release_key("ev2"), 1)
    assert h.run(start("ev2", "ticker"))["status"] == "completed"  # type: ignore[index]
    state_ttl, events_ttl = h.client.ttl("plaita:execution:ev2"), h.client.ttl("plaita:execution:events:ev2")
    assert 0 < state_ttl <= 600 and 0 < events_ttl <= 600


def test_a_publish_after_the_lease_moved_on_is_refused(h: Harness) -> None:
    """A worker paused past its lease TTL cannot overwrite what its successor published."""
    h.run(start("ev3", "waiter"))
    old, lease = leased_task(h, "ev3")
    h.leases.release(lease)
    new, lease2 = leased_task(h, "ev3")
    try:
        publisher(h.store, new, "s")("progress", 2)
        with pytest.raises(LeaseLostError):
            publisher(h.store, old, "s")("progress", 1)
    finally:
        h.leases.release(lease2)
    assert h.flows.events("ev3") == {"progress": 2}


@pytest.mark.parametrize(
    ("name", "value", "why"),
    [
        ("", 1, "name"),
        (7, 1, "name"),
        ("x" * 201, 1, "name"),
        ("p", math.nan, "strict JSON"),
        ("p", {"a": object()}, "strict JSON"),
        ("p", "x" * MAX_EVENT_BYTES, "limit"),
    ],
)
def test_a_bad_name_or_value_is_refused_in_the_step(h: Harness, name: Any, value: Any, why: str) -> None:
    h.run(start("ev4", "waiter"))
    task, lease = leased_task(h, "ev4")
    try:
        with pytest.raises(ValueError, match=why):
            publisher(h.store, task, "s")(name, value)
    finally:
        h.leases.release(lease)
    assert h.client.exists("plaita:execution:events:ev4") == 0


def test_at_most_max_events_names_and_a_known_name_may_always_be_published_again(h: Harness) -> None:
    h.run(start("ev5", "waiter"))
    task, lease = leased_task(h, "ev5")
    publish = publisher(h.store, task, "s")
    try:
        for i in range(MAX_EVENTS):
            publish(f"n{i}", i)
        with pytest.raises(ValueError, match=f"already has {MAX_EVENTS}"):
            publish("one-more", 1)
        publish("n0", "again")
    finally:
        h.leases.release(lease)
    events = h.flows.events("ev5")
    assert len(events) == MAX_EVENTS and events["n0"] == "again" and "one-more" not in events


def test_with_partitions_the_events_key_is_in_the_executions_slot(redis_url: str) -> None:
    ks = Keyspace("plaita:test:lease", partitions=4, tagged=True)
    client = make_client(redis_url, socket_timeout_s=5.0)
    try:
        store = ExecutionStore(client, ks)
        for eid in ("a", "b", "c", "d"):
            tag = ks.slot_tag(eid)
            assert ks.events_key(eid) == f"plaita:execution:events:{tag}:{eid}"
            assert tag in ks.execution_key(eid) and tag in ks.lease_key(eid)
        assert store.events("a") == {}
    finally:
        client.close()


def test_show_prints_the_events(h: Harness, redis_url: str) -> None:
    flowdefs.client().set(deadline_flows.release_key("ev6"), 1)
    h.run(start("ev6", "ticker", n=2))
    r = plaita(redis_url, "executions", "show", "ev6")
    assert r.returncode == 0, r.stderr
    assert "events:" in r.stdout and '{"done": 2, "of": 2}' in r.stdout and "partial" in r.stdout
    r = plaita(redis_url, "executions", "show", "ev6", "--json")
    assert json.loads(r.stdout)["events"]["progress"]["value"] == {"done": 2, "of": 2}


def test_a_context_outside_a_runner_cannot_publish() -> None:
    ctx = StepContext(
        execution_id="e", flow_id="f", step="s", params={}, state={}, results={}, resume=None, attempt=1,
        cancel=CancelFlag(),
    )  # fmt: skip
    with pytest.raises(RuntimeError, match="publisher"):
        ctx.set_progress(0.5)


def test_flow_client_reads_events_through_its_own_queue(redis_url: str, h: Harness) -> None:
    flowdefs.client().set(deadline_flows.release_key("ev7"), 1)
    h.run(start("ev7", "ticker", n=1))
    with FlowClient.from_url(redis_url, queue_name="plaita:flow:queue") as flows:
        assert flows.get_event("ev7", "progress") == {"done": 1, "of": 1}


def test_a_restart_keeps_the_earlier_events_while_the_execution_runs_again(h: Harness) -> None:
    """The retention TTL an ended execution's events got is dropped with the state's when it is
    restarted (``executions retry``), not left to expire under a running execution."""
    flowdefs.client().set(deadline_flows.release_key("ev3"), 1)
    assert h.run(start("ev3", "ticker"))["status"] == "completed"  # type: ignore[index]
    assert h.client.ttl("plaita:execution:events:ev3") > 0
    task, lease = leased_task(h, "ev3")
    try:
        doc = h.store.get("ev3")
        assert doc is not None
        running = json.dumps({**doc, "status": "running"})
        assert h.store.reopen("ev3", task.fencing_token or 0, running, 1.0)
    finally:
        h.leases.release(lease)
    assert h.client.ttl("plaita:execution:events:ev3") == -1 and h.client.ttl("plaita:execution:ev3") == -1
    assert h.flows.get_event("ev3", "partial") == {"rows": [1, 2, 3, 4], "final": True}
