"""Issue 31, item 4: how many starts wait for a slot is visible: ``plaita status`` (text and
JSON) and the ``plaita_flow_starts_waiting`` gauge (the dashboard's overview:
tests/dashboard/test_starts_waiting.py). Real redis-server;
the starts are parked by the store's own acquire, as a worker parks them."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from plaita.ops.metrics import Metrics
from plaita.store.client import make_client
from plaita.store.executions.flow_limits import PARKED, TAKEN, FlowLimitStore, waiting_starts
from plaita.store.keyspace import Keyspace
from tests.support.ops import QUEUE, plaita, plaita_json

pytestmark = pytest.mark.redis


def park(url: str, flow_id: str, n: int) -> None:
    """Hold ``flow_id``'s one slot and park ``n`` starts behind it."""
    client = make_client(url, socket_timeout_s=5.0)
    store = FlowLimitStore(client, Keyspace(QUEUE))
    opts: dict[str, Any] = {"max_concurrent": 1, "ttl_s": 60.0, "starts_per_s": 0.0, "burst": 1.0}
    try:
        assert store.acquire(flow_id, "holder", "tok", **opts).code == TAKEN
        store.register_parking(flow_id)
        for i in range(n):
            body = {"type": "start", "flow_id": flow_id, "execution_id": f"{flow_id}-{i}"}
            assert store.acquire(flow_id, f"{flow_id}-{i}", f"t{i}", park=(float(i), body, None), **opts).code == PARKED
    finally:
        client.close()


def test_plaita_status_shows_the_starts_waiting_for_a_slot(redis_url: str) -> None:
    park(redis_url, "export", 3)
    park(redis_url, "mail", 1)
    assert plaita_json(redis_url, "status")["starts_waiting_for_slot"] == {"export": 3, "mail": 1}
    done = plaita(redis_url, "status")
    assert done.returncode == 0, done.stderr
    lines = [line.strip() for line in done.stdout.splitlines()]
    assert "waiting for a slot: 3 start(s) of flow export" in lines


def test_the_gauge_counts_waiting_starts_per_flow(redis_url: str, rclient: redis.Redis) -> None:
    park(redis_url, "export", 2)
    metrics = Metrics()
    metrics.set_starts_waiting(waiting_starts(rclient, Keyspace(QUEUE)))
    assert 'plaita_flow_starts_waiting{flow="export"} 2.0' in metrics.render().decode()
