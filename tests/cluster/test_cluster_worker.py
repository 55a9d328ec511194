"""plaita on a real Redis Cluster (3 masters + 3 replicas, 6 partitions): every task once, the
partitions spread over every master, reclaim after kill -9, and a master failover ridden out."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from plaita.config import Settings
from plaita.store.stats import is_settled, stream_stats_or_empty
from plaita.store.streams.partitioned import PartitionedQueue, open_queue
from tests.support.lease_workers import QUEUE as LEASE_QUEUE
from tests.support.lease_workers import counter, server_client, worker_proc
from tests.support.redis_cluster import ClusterServers
from tests.support.workers import Recorder, running_worker, wait_for

pytestmark = [pytest.mark.redis, pytest.mark.chaos]

QUEUE = "plaita:test:queue"
PARTITIONS = 6
#: Subprocess workers that reclaim quickly: idle > 0.5 s and the 2 s lease gone.
FAST_RECLAIM = (
    "--claim-min-idle-ms",
    "500",
    "--lease-ttl-s",
    "2",
    "--reclaim-interval-s",
    "0.3",
    "--read-block-ms",
    "200",
)


def producer(cluster: ClusterServers, queue: str = QUEUE) -> PartitionedQueue:
    s = Settings(redis_url=cluster.url, queue_name=queue, consumer_name="producer", partitions=PARTITIONS)
    q = open_queue(s)
    assert isinstance(q, PartitionedQueue)
    return q


def bodies(n: int) -> list[dict[str, object]]:
    return [{"type": "start", "flow_id": "f", "execution_id": f"e{i}", "params": {"n": i}} for i in range(n)]


def test_a_clean_run_completes_every_task_once_on_every_master(clean_cluster: ClusterServers) -> None:
    q = producer(clean_cluster)
    owners = {clean_cluster.master_of_key(q.keyspace.stream(p)).port for p in range(PARTITIONS)}
    assert owners == {m.port for m in clean_cluster.masters()}  # six partitions, two per master
    ids = q.enqueue_many(bodies(300))
    rec = Recorder()
    with running_worker(clean_cluster.url, recorder=rec, partitions=PARTITIONS, concurrency=4):
        rec.wait_count(300, timeout_s=60)
        wait_for(lambda: is_settled(q), 15, "every partition acked")
    assert set(Counter(e.n for e in rec.executions).values()) == {1}
    assert sorted(rec.ids()) == sorted(ids)
    q.close()


def test_kill9_worker_its_tasks_are_reclaimed_on_every_partition(clean_cluster: ClusterServers, tmp_path: Path) -> None:
    """A worker holding tasks on all six partitions is killed -9; another worker reclaims every
    one of them once its lease expires, and each task completes exactly once."""
    q = producer(clean_cluster, LEASE_QUEUE)  # the queue worker_proc's workers read
    n = 24
    body = [
        {"type": "start", "flow_id": "f", "execution_id": f"k{i}", "params": {"first_sleep_s": 60}} for i in range(n)
    ]
    ids = q.enqueue_many(body)
    assert {i.split("/")[0] for i in ids} == {str(p) for p in range(PARTITIONS)}
    client = server_client(clean_cluster.url)
    args = ("--partitions", str(PARTITIONS), *FAST_RECLAIM)
    with worker_proc(clean_cluster.url, tmp_path, "ka", *args, "--concurrency", str(n)) as a:
        wait_for(lambda: sum(counter(client, "executions", f"k{i}") for i in range(n)) == n, 30, "A runs all")
        a.kill9()
    with worker_proc(clean_cluster.url, tmp_path, "kb", *args, "--concurrency", "4") as b:
        wait_for(lambda: all(counter(client, "completed", f"k{i}") == 1 for i in range(n)), 40, "B finishes all")
        assert b.terminate() == 0
        reclaimed = b.counters().get("reclaimed", 0)  # after the stop, which writes the status at once
    assert [counter(client, "executions", f"k{i}") for i in range(n)] == [2] * n
    assert reclaimed == n
    assert is_settled(q)
    q.close()
    client.close()


def test_a_v2_workers_tasks_on_every_partition_are_taken_over_by_a_v1_worker(
    clean_cluster: ClusterServers, tmp_path: Path
) -> None:
    """Lease format v2 on a cluster: each partition's generation counter lives in that partition's
    slot (no CROSSSLOT), and after a kill -9 the v1 worker runs every task under a generation above
    the v2 one (docs/reliability.md, "Lease format")."""
    q = producer(clean_cluster, LEASE_QUEUE)
    n = 12
    body = [
        {"type": "start", "flow_id": "f", "execution_id": f"m{i}", "params": {"first_sleep_s": 60}} for i in range(n)
    ]
    q.enqueue_many(body)
    client = server_client(clean_cluster.url)
    args = ("--partitions", str(PARTITIONS), *FAST_RECLAIM)
    with worker_proc(clean_cluster.url, tmp_path, "va", *args, "--concurrency", str(n), "--lease-format", "v2") as a:
        wait_for(lambda: sum(counter(client, "executions", f"m{i}") for i in range(n)) == n, 30, "A runs all")
        a.kill9()
    ks = q.keyspace
    v2_top = {p: int(client.get(ks.generation_key(p)) or 0) for p in range(PARTITIONS)}
    assert sum(v2_top.values()) == n and all(client.get(ks.fence_key(f"m{i}")) is None for i in range(n))
    with worker_proc(clean_cluster.url, tmp_path, "vb", *args, "--concurrency", "4") as b:
        wait_for(lambda: all(counter(client, "completed", f"m{i}") == 1 for i in range(n)), 40, "B finishes all")
        assert b.terminate() == 0
    # v1 stays above the partition's counter, which is at least the v2 generation of each execution
    assert [int(client.get(ks.fence_key(f"m{i}"))) for i in range(n)] == [
        v2_top[ks.partition_of(f"m{i}")] + 1 for i in range(n)
    ]
    assert is_settled(q)
    q.close()
    client.close()


class Producer(threading.Thread):
    """Enqueues one task at a time until stopped, remembering each acknowledged id and when."""

    def __init__(self, q: PartitionedQueue, wait_replicas: int) -> None:
        super().__init__(name="test-producer", daemon=True)
        self.q, self.wait_replicas = q, wait_replicas
        self.acked: dict[int, tuple[str, float]] = {}  # n -> (qualified id, monotonic time of the reply)
        self.failed = 0
        self.stop = threading.Event()

    def run(self) -> None:
        for n in range(100_000):  # bounded; stopped long before
            if self.stop.is_set():
                return
            body = {"type": "start", "flow_id": "f", "execution_id": f"f{n}", "params": {"n": n}}
            try:
                [mid] = self.q.enqueue_many([body], wait_replicas=self.wait_replicas, wait_timeout_ms=500)
                self.acked[n] = (mid, time.monotonic())
            except Exception:  # the master of its partition is down: not acknowledged, the producer's to retry
                self.failed += 1
                self.stop.wait(0.02)
            self.stop.wait(0.004)


@pytest.mark.parametrize("wait_replicas", [0, 1], ids=["async", "durable"])
def test_master_failover_is_ridden_out(clean_cluster: ClusterServers, wait_replicas: int) -> None:
    """kill -9 the master of two partitions mid-run: the worker backs off and carries on with the
    promoted replica; an acknowledged task is lost only if replication had not carried it yet
    (never with the durable enqueue, which waits for a replica)."""
    q = producer(clean_cluster)
    victim = clean_cluster.master_of_key(q.keyspace.stream(0)).port
    on_victim = {p for p in range(PARTITIONS) if clean_cluster.master_of_key(q.keyspace.stream(p)).port == victim}
    rec = Recorder()
    prod = Producer(q, wait_replicas)
    with running_worker(clean_cluster.url, recorder=rec, partitions=PARTITIONS, concurrency=4) as w:
        prod.start()
        wait_for(lambda: rec.count() >= 200, 20, "work flowing")
        clean_cluster.kill_master(victim)
        killed_at = time.monotonic()
        clean_cluster.wait_failover(victim)
        failover_s = time.monotonic() - killed_at
        clean_cluster.restart_node(victim)  # back as a replica of the promoted one: WAIT can succeed again
        before = len(prod.acked)
        wait_for(lambda: len(prod.acked) >= before + 100, 20, "100 more acknowledged tasks after the failover")
        prod.stop.set()
        prod.join(5)
        try:
            wait_for(lambda: is_settled(q), 30, "every partition settled after the failover")
        except AssertionError:  # say which partition is stuck
            print(json.dumps(stream_stats_or_empty(q), indent=1, default=str))
            raise
        assert w.alive
        wait_for(lambda: w.worker.lifecycle.state.name == "READING", 10, "READING after the failover")
    done = Counter(e.n for e in rec.executions)
    lost = [n for n in prod.acked if n not in done]
    print(
        f"\nfailover in {failover_s:.1f} s; acked {len(prod.acked)}, refused {prod.failed}, lost {len(lost)}, "
        f"ran twice {sum(1 for c in done.values() if c > 1)} (wait_replicas={wait_replicas})"
    )
    for n in lost:  # only what the dead master acknowledged shortly before it died
        mid, at = prod.acked[n]
        assert int(mid.split("/")[0]) in on_victim and killed_at - at < 2.0, (n, mid, killed_at - at)
    if wait_replicas:
        assert lost == []
    q.close()


def test_a_graceful_stop_hands_back_on_every_partition(clean_cluster: ClusterServers, tmp_path: Path) -> None:
    """SIGTERM with work read ahead on several partitions: what did not finish goes back to its own
    partition at once (nothing left pending), and the worker exits 0 within the drain bound."""
    q = producer(clean_cluster, LEASE_QUEUE)
    body = [
        {"type": "start", "flow_id": "f", "execution_id": f"h{i}", "params": {"first_sleep_s": 30}} for i in range(12)
    ]
    used = {int(mid.split("/")[0]) for mid in q.enqueue_many(body)}
    client = server_client(clean_cluster.url)
    args = ("--partitions", str(PARTITIONS), "--concurrency", "2", "--prefetch", "10", "--drain-timeout-s", "0.3")
    with worker_proc(clean_cluster.url, tmp_path, "hb", *args) as w:
        wait_for(lambda: sum(counter(client, "executions", f"h{i}") for i in range(12)) == 2, 20, "two running")
        wait_for(lambda: stream_stats_or_empty(q)["pending"] == 12, 10, "the rest read ahead")
        started = time.monotonic()
        assert w.terminate() == 0
        assert time.monotonic() - started < 3.0
        assert "Traceback" not in w.stderr()
    stats = stream_stats_or_empty(q)
    assert (stats["pending"], stats["length"]) == (0, 12)
    assert {p for p, row in enumerate(stats["partitions"]) if int(row["length"]) > 0} == used
    q.close()
    client.close()
