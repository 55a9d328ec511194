"""Worker registry: ``plaita:registry:flow_worker:{instance}`` as operators and `plaita workers` read it."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from plaita import __version__
from tests.support.ops import REGISTRY_PREFIX, enqueue, ops_worker, plaita, task, wait_until
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.redis

#: Seconds the private server stays frozen: longer than the 2 s registry TTL.
FREEZE_S = 3.0


def _assert_names_the_process(entry: dict[str, Any], w: Any) -> None:
    """A fresh READING entry: who and where the worker is, nothing counted, no error."""
    assert entry["instance_id"] == w.instance_id
    assert entry["host"].startswith(socket.gethostname())
    assert entry["pid"] == w.proc.pid
    assert entry["version"] == __version__
    assert entry["consumer"] == w.consumer
    assert entry["state"] == "READING" and entry["status"] == "running"
    assert time.time() - 30 < entry["state_since"] <= time.time()
    assert entry["in_flight"] == 0
    assert (entry["processed"], entry["failed"], entry["dead_lettered"]) == (0, 0, 0)
    assert "last_error" in entry and entry["last_error"] is None


class TestRegistryEntry:
    def test_entry_fields_ttl_counters_and_removal(self, redis_url: str, rclient: redis.Redis, tmp_path: Path) -> None:
        """The entry names the process, follows counters and state changes, lives ≤ TTL, and is deleted on stop."""
        with ops_worker(redis_url, tmp_path, "--max-deliveries", "1") as w:
            key = REGISTRY_PREFIX + w.instance_id

            def reading() -> dict[str, Any] | None:
                e = w.registry_entry(rclient)
                return e if e is not None and e["state"] == "READING" else None

            _assert_names_the_process(wait_until(reading, 5, "a READING registry entry"), w)
            assert 0 < rclient.pttl(key) <= 2000, "the entry must expire within --registry-ttl without heartbeats"

            for n in range(3):
                enqueue(rclient, task(n))
            enqueue(rclient, task(9, fail=True))

            def counted() -> bool:
                e = w.registry_entry(rclient)
                return e is not None and (e["processed"], e["failed"], e["dead_lettered"]) == (3, 1, 1)

            wait_until(counted, 5, "processed=3 failed=1 dead_lettered=1 in the registry")

            paused = plaita(redis_url, "pause", w.instance_id)
            assert paused.returncode == 0, paused.stderr

            def shows_paused() -> bool:
                e = w.registry_entry(rclient)
                return e is not None and e["state"] == "PAUSED" and e["status"] == "paused"

            wait_until(shows_paused, 3, "state PAUSED in the registry")
            assert w.terminate() == 0
        assert rclient.exists(key) == 0, "a stopped worker must remove its registry entry"

    def test_last_error_and_backoff_published_while_redis_refuses(
        self, redis_url: str, rclient: redis.Redis, tmp_path: Path
    ) -> None:
        """A persistent error (WRONGTYPE stream) shows as BACKOFF with last_error, and clears once fixed."""
        with ops_worker(redis_url, tmp_path) as w:
            rclient.delete("plaita:test:queue")
            rclient.set("plaita:test:queue", "not a stream")

            def refused() -> dict[str, Any] | None:
                e = w.registry_entry(rclient)
                # Deleting the stream under a blocked read first shows as a transient UNBLOCKED;
                # the retry then meets the string key: WRONGTYPE.
                ok = e is not None and e["state"] == "BACKOFF" and "WRONGTYPE" in str(e["last_error"] or "")
                return e if ok else None

            entry = wait_until(refused, 10, "BACKOFF with a WRONGTYPE last_error in the registry")
            assert entry["status"] == "running"
            rclient.delete("plaita:test:queue")

            def recovered() -> bool:
                e = w.registry_entry(rclient)
                return e is not None and e["state"] == "READING" and e["last_error"] is None

            wait_until(recovered, 10, "READING with last_error cleared")


@pytest.mark.chaos
class TestRegistryThroughFaults:
    def test_entry_tracks_state_through_a_freeze(self, private_redis: RedisServer, tmp_path: Path) -> None:
        """Frozen longer than the TTL, the entry comes back after thaw with the current state and a fresh beat."""
        client = private_redis.client()
        with ops_worker(private_redis.url, tmp_path) as w:
            wait_until(lambda: w.registry_entry(client), 5, "registry entry")
            wait_until(lambda: w.control_subscribed(client), 5, "the control listener subscribed")
            private_redis.freeze()
            try:
                w.wait_state("BACKOFF", timeout_s=FREEZE_S + 2)  # the status file keeps tracking locally
                frozen_for_s = FREEZE_S - 0.5
                time.sleep(frozen_for_s)  # the fault's duration, not a synchronisation
            finally:
                private_redis.thaw()
            thawed_at = time.time()

            def fresh() -> bool:
                e = w.registry_entry(client)
                return e is not None and e["state"] == "READING" and e["last_heartbeat"] >= thawed_at

            wait_until(fresh, 8, "a fresh READING entry after thaw")
            assert 0 < client.pttl(REGISTRY_PREFIX + w.instance_id) <= 2000
            stopped = plaita(private_redis.url, "stop", w.instance_id)
            assert stopped.returncode == 0, stopped.stderr
            assert w.wait_exit(5) == 0
            log = w.stderr()
        assert "TypeError" not in log and "Traceback" not in log, log
        assert "control channel" not in log, f"a freeze does not break the subscription:\n{log}"
        assert client.exists(REGISTRY_PREFIX + w.instance_id) == 0
        client.close()
