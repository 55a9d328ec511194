"""Sentinel failover: one master, one replica, three sentinels, all private on loopback.

A worker on ``redis+sentinel://…/plaita-test`` consumes, the master is killed with SIGKILL, the
sentinels promote the replica, and the worker continues on the new master without exiting.
Tasks enqueued with WAIT (the durable enqueue) are never lost; tasks enqueued without it right
before the kill may be (asynchronous replication), and the test reports how many were.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest
import redis

from plaita.store.client import make_client
from plaita.store.streams.queue import StreamQueue
from tests.support.handlers import read_log
from tests.support.redis_server import SERVER_ENV, RedisServer, free_port, redis_server_binary
from tests.support.workers import wait_for, worker_process

pytestmark = [
    pytest.mark.redis,
    pytest.mark.chaos,
    pytest.mark.skipif(os.environ.get(SERVER_ENV) == "valkey", reason="Sentinel runs on Debian's redis-server"),
]

SERVICE = "plaita-test"
STREAM = "plaita:test:queue"


@contextmanager
def sentinel(tmp_path: Path, n: int, master_port: int) -> Iterator[int]:
    port = free_port()
    conf = tmp_path / f"sentinel-{n}.conf"
    conf.write_text(
        f"port {port}\nbind 127.0.0.1\ndir {tmp_path}\n"
        f"sentinel monitor {SERVICE} 127.0.0.1 {master_port} 2\n"
        f"sentinel down-after-milliseconds {SERVICE} 800\n"
        f"sentinel failover-timeout {SERVICE} 3000\n",
        encoding="utf-8",
    )
    proc = subprocess.Popen(
        [redis_server_binary(), str(conf), "--sentinel"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        yield port
    finally:
        proc.terminate()
        proc.wait(5)


def master_port(sentinel_port: int) -> int | None:
    c = redis.Redis(host="127.0.0.1", port=sentinel_port, socket_timeout=1, decode_responses=True)
    try:
        addr = c.execute_command("SENTINEL", "get-master-addr-by-name", SERVICE)
        return int(addr[1]) if addr else None
    except redis.RedisError:
        return None
    finally:
        c.close()


def replicas_known(sentinel_port: int) -> int:
    c = redis.Redis(host="127.0.0.1", port=sentinel_port, socket_timeout=1)
    try:
        return len(c.execute_command("SENTINEL", "replicas", SERVICE))
    except redis.RedisError:
        return 0
    finally:
        c.close()


def body(n: int) -> dict[str, object]:
    return {"type": "start", "flow_id": "f", "params": {"n": n}}


def test_worker_rides_a_sentinel_failover_and_durable_enqueues_are_not_lost(tmp_path: Path) -> None:
    with ExitStack() as stack:
        master = stack.enter_context(RedisServer(persist=False))
        replica = stack.enter_context(
            RedisServer(persist=False, extra_args=["--replicaof", "127.0.0.1", str(master.port)])
        )
        ports = [stack.enter_context(sentinel(tmp_path, i, master.port)) for i in range(3)]
        wait_for(lambda: all(replicas_known(p) == 1 for p in ports), 20.0, "sentinels to see the replica")
        link = replica.client(decode_responses=True)
        wait_for(lambda: link.info("replication").get("master_link_status") == "up", 20.0, "the replica in sync")
        link.close()
        url = f"redis+sentinel://{','.join(f'127.0.0.1:{p}' for p in ports)}/{SERVICE}/0"
        producer = StreamQueue(
            make_client(url, socket_timeout_s=5.0), stream=STREAM, group="", consumer="", dlq_key="", dlq_max_len=1
        )
        args = ("--handler", "tests.support.handlers:record", "--read-block-ms", "100", "--queue-name", STREAM)
        w = stack.enter_context(worker_process(url, tmp_path, *args))
        w.wait_state("READING", 15)
        durable = producer.enqueue_many([body(i) for i in range(20)], wait_replicas=1, wait_timeout_ms=3000)
        fragile = producer.enqueue_many([body(100 + i) for i in range(20)])  # no WAIT, right before the kill

        master.kill()
        wait_for(lambda: master_port(ports[0]) == replica.port, 30.0, "the sentinels to promote the replica")

        def add_after() -> list[str]:
            try:
                return producer.enqueue_many([body(200 + i) for i in range(10)], wait_replicas=0)
            except redis.RedisError:
                return []  # the producer's own connection still points at the old master: retry

        deadline = time.monotonic() + 20
        after: list[str] = []
        while not after:
            assert time.monotonic() < deadline, "could not enqueue on the new master"
            after = add_after()
            time.sleep(0.1)

        def done() -> set[str]:
            return {m for event, m, _n, _d in read_log(str(tmp_path / "w.log")) if event == "done"}

        wait_for(lambda: set(durable) | set(after) <= done(), 30.0, "every durable and post-failover task done")
        assert w.proc.poll() is None, w.stderr()
        lost_fragile = [m for m in fragile if m not in done()]
        print(json.dumps({"durable_lost": 0, "fragile_enqueued": len(fragile), "fragile_lost": len(lost_fragile)}))
        assert "Traceback" not in w.stderr()
