"""``plaita status``: executions per status for the default tenant and each tenant of
``plaita:tenants`` (at most ``MAX_TENANTS_COUNTED`` listed, the rest counted). Real Redis."""

from __future__ import annotations

from typing import Any

import pytest

from plaita.store.stats import execution_counts
from tests.flows.support import Harness, start
from tests.support.ops import plaita, plaita_json

pytestmark = pytest.mark.redis


def suspend(h: Harness, eid: str, tenant: str | None = None) -> None:
    body: dict[str, Any] = start(eid, "signup", timeout_s=3600)
    if tenant is not None:
        body["tenant_id"] = tenant
    doc = h.run(body)
    assert doc is None or doc["status"] == "suspended"


def test_status_counts_every_tenants_executions(h: Harness, redis_url: str) -> None:
    suspend(h, "d1")
    suspend(h, "a1", "acme")
    suspend(h, "a2", "acme")
    suspend(h, "b1", "beta")
    counts = plaita_json(redis_url, "status")["executions"]
    assert counts["default"]["suspended"] == 1
    assert {t: c["suspended"] for t, c in counts["tenants"].items()} == {"acme": 2, "beta": 1}
    assert counts["tenants_more"] == 0
    done = plaita(redis_url, "status")
    assert done.returncode == 0, done.stderr
    lines = [line.strip() for line in done.stdout.splitlines()]
    assert "executions: 1 suspended" in lines
    assert "tenant acme: 2 suspended" in lines and "tenant beta: 1 suspended" in lines


def test_the_tenants_listed_are_bounded(h: Harness) -> None:
    for tenant in ("t1", "t2", "t3"):
        suspend(h, f"e-{tenant}", tenant)
    counts = execution_counts(h.client, h.queue.keyspace, max_tenants=2)
    assert list(counts["tenants"]) == ["t1", "t2"] and counts["tenants_more"] == 1
