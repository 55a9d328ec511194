"""A step's exception is described without trusting it: one whose ``str()`` or ``repr()`` raises
still fails the attempt and ends the execution in ``error`` (before, describing it raised out of
the runner: the task was redelivered, dead-lettered, and the execution stayed ``running``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from plaita.flows import Flow, FlowRunner, RetryPolicy
from plaita.store.client import make_client
from plaita.store.executions.store import ExecutionStore
from plaita.store.leases import Lease, LeaseManager
from plaita.tasks import Task

pytestmark = pytest.mark.redis


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("__str__ itself fails")

    def __repr__(self) -> str:
        raise RuntimeError("__repr__ itself fails")


hostile = Flow("hostile_exc", retry=RetryPolicy(max_attempts=2, base_s=0.001, cap_s=0.001))


@hostile.step
def boom(ctx: Any) -> None:
    raise Unprintable("never shown")


@pytest.fixture
def runner(redis_url: str) -> Iterator[tuple[FlowRunner, ExecutionStore, LeaseManager]]:
    client = make_client(redis_url, socket_timeout_s=5.0)
    store = ExecutionStore(client)
    r = FlowRunner([hostile], store)
    yield r, store, LeaseManager(client, consumer="hostile-exc", ttl_s=30.0)
    r.close()
    client.close()


def test_an_exception_whose_str_raises_ends_the_execution_in_error(
    runner: tuple[FlowRunner, ExecutionStore, LeaseManager],
) -> None:
    run, store, leases = runner
    for attempt in (1, 2):  # each attempt is one task (the retry is a re-enqueued task or the same run)
        doc = store.get("ue-1")
        if doc is not None and doc["status"] == "error":
            break
        body = {"type": "start", "flow_id": "hostile_exc", "execution_id": "ue-1"}
        if doc is not None:
            body = {"type": "resume", "execution_id": "ue-1", "resume_type": "retry"}
        task = Task(f"{attempt}-0", body, 1)
        lease = leases.acquire("ue-1")
        assert isinstance(lease, Lease)
        task.fencing_token = lease.generation
        try:
            run(task)
        finally:
            leases.release(lease)
    doc = store.get("ue-1")
    assert doc is not None and doc["status"] == "error", doc
    assert doc["error"]["type"] == "Unprintable" and "unprintable" in doc["error"]["message"].lower()
