"""Fixtures for the dashboard: apps over the private Redis, logged-in clients, dead letters."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from starlette.testclient import TestClient

from plaita.dashboard.app import DashboardConfig, create_app
from plaita.store.keyspace import DEFAULT
from tests.support.ops import DLQ, QUEUE, REGISTRY_PREFIX

#: The action token every test dashboard is started with.
TOKEN = "test-token-0123456789abcdef"
#: What a browser on the dashboard's own page sends with a form post.
SAME_ORIGIN = {"Origin": "http://testserver"}

MakeDashboard = Callable[..., TestClient]


@pytest.fixture
def make_dashboard(redis_url: str) -> Iterator[MakeDashboard]:
    """Build a dashboard app (sampler not started: tests call ``sample``) and its TestClient."""
    clients: list[TestClient] = []

    def make(
        *, allow_actions: bool = True, url: str | None = None, token: str | None = TOKEN, partitions: int = 1
    ) -> TestClient:
        config = DashboardConfig(
            redis_url=url or redis_url,
            queue_name=QUEUE,
            partitions=partitions,
            allow_actions=allow_actions,
            token=token if allow_actions else None,
            allowed_hosts=("testserver",),
        )
        client = TestClient(create_app(config, start_monitor=False))
        client.__enter__()
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.__exit__(None, None, None)


def sample(client: TestClient) -> dict[str, Any]:
    """Take one sample now (what the sampler thread does every second, and every few seconds for
    the per-flow figures) and return the picture."""
    monitor = client.app.state.dashboard.monitor  # type: ignore[attr-defined]
    monitor.sample_once()
    monitor.sample_figures()
    return dict(monitor.snapshot())


def login(client: TestClient) -> str:
    """Log in with the token; returns the session's CSRF token."""
    r = client.post("/login", data={"token": TOKEN}, headers=SAME_ORIGIN, follow_redirects=False)
    assert r.status_code == 303, r.text
    return csrf_of(client.get("/workers").text)


def csrf_of(page: str) -> str:
    match = re.search(r'name="csrf" value="([^"]+)"', page)
    assert match, "no CSRF field on the page"
    return match.group(1)


def dead_letter(client: redis.Redis, *, reason: str, payload: Any, deliveries: int = 5, source_id: str = "1-0") -> str:
    """Add one DLQ entry in the envelope format the worker writes; returns its id."""
    envelope = {
        "reason": reason,
        "source_stream": QUEUE,
        "source_id": source_id,
        "delivery_count": deliveries,
        "dead_lettered_at": time.time() - 90,
        "payload": payload,
    }
    mid = client.xadd(DLQ, {"payload": json.dumps(envelope)})
    return mid.decode() if isinstance(mid, bytes) else str(mid)


def register(client: redis.Redis, instance_id: str, **fields: Any) -> None:
    """A registry entry as a worker writes it (for pages that need no live worker)."""
    now = time.time()
    entry = {
        "instance_id": instance_id,
        "host": "host-a/10.0.0.1",
        "state": "READING",
        "state_since": now - 42,
        "in_flight": 1,
        "processed": 10,
        "failed": 2,
        "dead_lettered": 1,
        "last_error": None,
        "ready": True,
        "ready_reason": "ok: READING",
        "last_heartbeat": now - 3,
        **fields,
    }
    client.set(REGISTRY_PREFIX + instance_id, json.dumps(entry), ex=60)


def plant(client: redis.Redis, eid: str, status: str, updated_at: float, **fields: Any) -> None:
    """An execution's state and index entry as a checkpoint writes them (for states no test flow reaches)."""
    doc = {"execution_id": eid, "flow_id": "f1", "status": status, "step": "s", "attempt": 0, "history": [],
           "steps_run": 0, "params": {}, "state": {}, "results": {}, "error": None, "created_at": updated_at - 5,
           "updated_at": updated_at, "ended_at": None, **fields}  # fmt: skip
    client.set(DEFAULT.execution_key(eid), json.dumps(doc))
    client.zadd(DEFAULT.status_key(0, status), {eid: updated_at})
