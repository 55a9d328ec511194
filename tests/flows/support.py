"""Helpers for the flow tests: run one task through a FlowRunner holding a real lease."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis

from plaita.flows import FlowRunner
from plaita.flows.producer.client import FlowClient
from plaita.store.client import make_client
from plaita.store.executions.flow_limits import FlowLimitStore
from plaita.store.executions.store import ExecutionStore
from plaita.store.leases import Lease, LeaseManager
from plaita.store.streams.queue import StreamQueue
from plaita.tasks import Task
from tests.flows import flowdefs
from tests.support.lease_workers import QUEUE

_ids = itertools.count(1)


class Harness:
    """A FlowRunner over the test flows, fed tasks by hand under a real lease."""

    def __init__(self, url: str, flows: Any = None, **runner_options: Any) -> None:
        self.client = make_client(url, socket_timeout_s=5.0)
        self.store = ExecutionStore(self.client)
        self.leases = LeaseManager(self.client, consumer=f"harness-{next(_ids)}", ttl_s=30.0)
        self.runner = FlowRunner(flowdefs.FLOWS if flows is None else flows, self.store, **runner_options)
        self.queue = StreamQueue(
            self.client, stream=QUEUE, group="plaita-workers", consumer="h", dlq_key="d", dlq_max_len=10
        )
        self.flows = FlowClient(self.queue, self.store)

    def task(self, body: dict[str, Any], message_id: str | None = None) -> tuple[Task, Lease]:
        task = Task(message_id or f"{next(_ids)}-0", body, 1)
        task.keyspace = self.store.of(task).ks  # a tenant's task (body ``tenant_id``): its own keys
        lease = self.leases.acquire_many([task.execution_id], [task.keyspace])[0]
        assert isinstance(lease, Lease), f"lease of {task.execution_id} held by {lease}"
        task.fencing_token = lease.generation
        return task, lease

    def run(self, body: dict[str, Any], message_id: str | None = None) -> dict[str, Any] | None:
        task, lease = self.task(body, message_id)
        try:
            self.runner(task)
        finally:
            self.leases.release(lease)
        return self.store.of(task).get(task.execution_id)

    def deliver(self, seen: list[str]) -> dict[str, Any] | None:
        """Run every task on the stream but the ids in ``seen`` (the ones delivered already; the
        new ones are added), in order, as a worker reads them; the document after the last."""
        doc = None
        for mid, fields in self.client.xrange(self.queue.stream):
            text = mid.decode() if isinstance(mid, bytes) else mid
            if text not in seen:
                seen.append(text)
                doc = self.run(json.loads(fields[b"payload"]), message_id=text)
        return doc

    def close(self) -> None:
        self.runner.close()
        self.client.close()


def limits(h: Harness) -> FlowLimitStore:
    """The fleet-wide limit records (slots, rates, overrides) of ``h``'s flows."""
    return FlowLimitStore(h.client, h.store.ks)


@contextmanager
def harness(url: str, **runner_options: Any) -> Iterator[Harness]:
    h = Harness(url, **runner_options)
    try:
        yield h
    finally:
        h.close()


def start(eid: str, flow: str = "ledger3", **params: Any) -> dict[str, Any]:
    return {"type": "start", "flow_id": flow, "execution_id": eid, "params": params}


def resume(eid: str, rtype: str = "event", data: Any = None, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"type": "resume", "execution_id": eid, "resume_type": rtype, **extra}
    if data is not None:
        body["data"] = data
    return body


def ledgers(eid: str, steps: list[str], kind: str = "ledger") -> list[int]:
    return [flowdefs.ledger(eid, s, kind) for s in steps]


def rtext(client: redis.Redis, key: str) -> str | None:
    value = client.get(key)
    return value.decode() if isinstance(value, bytes) else value  # type: ignore[return-value]


def dlq(client: redis.Redis) -> list[dict[str, Any]]:
    """The DLQ envelopes of the test queue (bytes or text replies)."""
    entries = client.xrange(f"{QUEUE}:dlq")
    return [json.loads(f.get("payload") or f[b"payload"]) for _, f in entries]  # type: ignore[union-attr]
