"""The cluster harness itself: keys really spread over the masters, a killed master is replaced by
its replica (and a write to its slots succeeds), and the killed node rejoins as a replica."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.support.redis_cluster import NO_CLI_REASON, SLOTS, ClusterServers, redis_cli_missing
from tests.support.workers import wait_for

pytestmark = [pytest.mark.redis, pytest.mark.skipif(redis_cli_missing(), reason=NO_CLI_REASON)]

KEY = "plaita:test:failover"


def test_keys_spread_over_every_master(clean_cluster: ClusterServers) -> None:
    masters = clean_cluster.masters()
    assert len(masters) == 3
    assert sum(hi - lo + 1 for m in masters for lo, hi in m.slots) == SLOTS
    keys = [f"plaita:test:k{i}" for i in range(300)]
    client = clean_cluster.client()
    try:
        for key in keys:
            client.set(key, "1")
    finally:
        client.close()
    owners = {clean_cluster.master_of_key(k).port for k in keys}
    assert owners == {m.port for m in masters}
    sizes = {}
    for m in masters:  # ask each node itself: the keys are there, not just in the slot table
        node = clean_cluster.node_client(m.port)
        try:
            sizes[m.port] = int(node.dbsize())
        finally:
            node.close()
    assert sum(sizes.values()) == len(keys) and min(sizes.values()) > 0


def test_url_and_pids_name_the_running_nodes(redis_cluster: ClusterServers) -> None:
    assert redis_cluster.url == "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in redis_cluster.startup_ports)
    assert len(redis_cluster.startup_ports) == 3
    pids = redis_cluster.pids()
    assert len(pids) == 6
    for pid in pids.values():  # what a benchmark reads for CPU time
        comm = Path(f"/proc/{pid}/stat").read_text().split(")")[0].split("(", 1)[1]
        assert comm in {"redis-server", "valkey-server"}


def test_killed_master_is_replaced_by_its_replica_and_rejoins(clean_cluster: ClusterServers) -> None:
    cl = clean_cluster
    victim = cl.master_of_key(KEY)
    (replica,) = [n for n in cl.nodes() if n.master_id == victim.node_id]
    write_replicated(cl, victim.port, "before")

    t0 = time.monotonic()
    cl.kill_master(victim.port)
    new_port = cl.wait_failover(victim.port)
    print(f"failover after kill -9: {time.monotonic() - t0:.2f} s")  # visible with -s
    assert new_port == replica.port
    assert cl.master_of_key(KEY).port == new_port
    client = cl.client()  # a fresh client: its first CLUSTER SLOTS already names the new master
    try:
        assert client.get(KEY) == b"before"
        client.set(KEY, "after")
        assert client.get(KEY) == b"after"
    finally:
        client.close()

    cl.restart_node(victim.port)
    rejoined = next(n for n in cl.nodes() if n.port == victim.port)
    assert not rejoined.is_master and rejoined.master_id == replica.node_id
    node = cl.node_client(victim.port)
    try:
        node.execute_command("READONLY")  # a replica answers reads of its slots only after READONLY
        wait_for(lambda: node.get(KEY) == b"after", 5.0, "the rejoined node to replicate the write")
    finally:
        node.close()


def write_replicated(cl: ClusterServers, port: int, value: str) -> None:
    """SET on the master, then WAIT until its replica has it: replication is asynchronous, and the
    write must survive the kill for the test to see it on the promoted replica."""
    node = cl.node_client(port, timeout_s=5.0)
    try:
        node.set(KEY, value)
        assert node.execute_command("WAIT", 1, 5000) == 1
    finally:
        node.close()
