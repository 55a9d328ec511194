"""The fleet check's result is shared: one worker per queue, group, partition count and kind scans
the keyspace per interval, the others use its result (``plaita:fleetcheck:v1:…``).

``FleetCheck`` against the shared private redis-server; whether a check scanned is read from the
server's own ``INFO commandstats`` (SCAN calls), not from the code.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis

from plaita.ops.fleetcheck import FleetCheck
from plaita.store.fleet import FLEETCHECK_PREFIX
from plaita.store.fleet_access import FleetAccess
from plaita.store.keyspace import Keyspace
from tests.support.ops import wait_until

pytestmark = pytest.mark.redis

QUEUE = "plaita:test:fleetshare"
FLOWS = {"runs": {"flows": ["f@1"]}}
HANDLER = {"runs": {"handler": "m:h"}}


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_url)
    c.xadd(f"{QUEUE}:{{p3}}", {"payload": "{}"})  # a partition stream nobody with 1 partition reads
    yield c
    c.close()


def scans(c: redis.Redis) -> int:
    stats: dict[str, Any] = c.info("commandstats")
    return int(stats.get("cmdstat_scan", {}).get("calls", 0))


def fleet_check(c: redis.Redis, name: str, kind: dict[str, Any], **kw: Any) -> tuple[FleetCheck, list[str | None]]:
    told: list[str | None] = []
    me = {"instance_id": name, "stream": QUEUE, "group": "g", "partitions": 1, **kind}
    check = FleetCheck(FleetAccess(c), Keyspace(QUEUE, 1, False), "g", me=lambda: me, on_change=told.append, **kw)
    return check, told


def test_a_second_worker_uses_the_first_ones_result_without_scanning(client: redis.Redis) -> None:
    a, _ = fleet_check(client, "a", FLOWS)
    found = a.run()
    assert len(found) == 1 and "1 task(s) wait" in found[0]
    before = scans(client)
    b, told_b = fleet_check(client, "b", FLOWS)
    assert b.run() == found and told_b == [found[0]]  # its readiness reason, as if it had checked
    assert scans(client) == before
    assert b.problems == found


def test_another_kind_or_partition_count_checks_for_itself(client: redis.Redis) -> None:
    fleet_check(client, "a", FLOWS)[0].run()
    before = scans(client)
    h, _ = fleet_check(client, "h", HANDLER)  # a handler worker on a flow queue must see it at once
    assert h.run()
    assert scans(client) > before
    keys = sorted(k.decode() for k in client.scan_iter(match=f"{FLEETCHECK_PREFIX}*"))
    assert keys == [f"{FLEETCHECK_PREFIX}flows:1:g:{QUEUE}", f"{FLEETCHECK_PREFIX}handler:1:g:{QUEUE}"]


def test_an_unregistered_worker_neither_uses_nor_shares(client: redis.Redis) -> None:
    fleet_check(client, "a", FLOWS)[0].run()
    client.set(f"{FLEETCHECK_PREFIX}flows:1:g:{QUEUE}", '["a stale line"]')
    before = scans(client)
    alone, _ = fleet_check(client, "x", FLOWS, share=False)
    found = alone.run()
    assert scans(client) > before and found != ["a stale line"] and "1 task(s) wait" in found[0]
    assert client.get(f"{FLEETCHECK_PREFIX}flows:1:g:{QUEUE}") == b'["a stale line"]'


def test_the_result_expires_after_the_interval_and_is_checked_again(client: redis.Redis) -> None:
    a, _ = fleet_check(client, "a", FLOWS, every_s=0.3)
    a.run()
    key = f"{FLEETCHECK_PREFIX}flows:1:g:{QUEUE}"
    wait_until(lambda: client.exists(key) == 0, 5, "the shared result expired")
    before = scans(client)
    b, _ = fleet_check(client, "b", FLOWS, every_s=0.3)
    assert b.run()
    assert scans(client) > before and client.exists(key) == 1


@pytest.mark.parametrize("stored", [b"not json", b'{"a": 1}', b"[1, 2]"])
def test_an_unreadable_shared_result_means_checking_alone(client: redis.Redis, stored: bytes) -> None:
    client.set(f"{FLEETCHECK_PREFIX}flows:1:g:{QUEUE}", stored)
    found, _ = fleet_check(client, "a", FLOWS)
    assert "1 task(s) wait" in found.run()[0]


def test_a_user_without_the_shared_key_still_checks(redis_url: str, client: redis.Redis) -> None:
    rules = "~plaita:test:* ~plaita:registry:* -@all +scan +get +set +mget +xlen +type"
    client.execute_command("ACL", "SETUSER", "fleetshare", "reset", "on", ">pw", "resetkeys", *rules.split())
    try:
        user = redis.Redis.from_url(redis_url.replace("redis://", "redis://fleetshare:pw@"))
        try:
            found, _ = fleet_check(user, "a", FLOWS)
            assert "1 task(s) wait" in found.run()[0]  # NOPERM on plaita:fleetcheck:… only: checked alone
        finally:
            user.close()
    finally:
        client.execute_command("ACL", "DELUSER", "fleetshare")
