"""The cluster client's edges: a cluster that is down at start, and a plain server named in a
cluster URL (each a BACKOFF with one clear line, never an exit or a traceback)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.redis_server import RedisServer, free_port
from tests.support.workers import wait_for, worker_process

pytestmark = pytest.mark.redis


def test_a_cluster_down_at_start_is_an_outage_not_an_exit(tmp_path: Path) -> None:
    url = f"redis+cluster://127.0.0.1:{free_port()},127.0.0.1:{free_port()}"
    with worker_process(url, tmp_path, "--partitions", "3", "--read-block-ms", "100") as w:
        w.wait_state("BACKOFF", 15)
        wait_for(lambda: "Redis unavailable" in w.stderr(), 10, "the outage line")
        assert w.proc.poll() is None and "Traceback" not in w.stderr()
        w.proc.terminate()
        assert w.proc.wait(10) == 0


def test_a_plain_server_in_a_cluster_url_says_so(redis_server: RedisServer, tmp_path: Path) -> None:
    url = f"redis+cluster://127.0.0.1:{redis_server.port}"
    with worker_process(url, tmp_path, "--read-block-ms", "100") as w:
        w.wait_state("BACKOFF", 15)
        wait_for(lambda: "is not a Redis Cluster" in w.stderr(), 10, "the misconfiguration line")
        assert "Traceback" not in w.stderr() and w.proc.poll() is None


def test_a_failed_cluster_build_leaves_no_connection_open(redis_server: RedisServer) -> None:
    """redis-py's RedisCluster constructor keeps the connection it asked for the slot map on when
    it then fails; plaita closes it, so a worker retrying in BACKOFF does not leave one socket per
    attempt for the garbage collector (whose ResourceWarning then failed an unrelated test)."""
    import gc

    from plaita.store.client import NotAClusterError, make_client

    admin = redis_server.client()
    name = "plaita:leak-probe"
    gc.disable()  # only an explicit close may end that connection here, not the collector
    try:
        client = make_client(f"redis+cluster://127.0.0.1:{redis_server.port}", socket_timeout_s=2, client_name=name)
        for _ in range(3):
            with pytest.raises(NotAClusterError):
                client.ping()
        clients = [c for c in admin.client_list() if c.get("name") == name]
        assert clients == [], clients
        client.close()
    finally:
        gc.enable()
        admin.close()
