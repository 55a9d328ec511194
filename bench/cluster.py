"""``python -m bench.cluster``: ``plaita worker`` throughput on one redis-server vs a Redis Cluster.

Targets, in one run: (a) one private redis-server, one stream ``<queue>`` (no ``--partitions``);
(b) a private 3-master + 3-replica cluster, ``--partitions 6``, partition i's stream
``<queue>:{p<i>}``. Each with 1, 2 and 4 worker processes (``--concurrency`` each).

Per run: a fresh queue and an emptied server; ``enqueue_partitioned`` XADDs every task, then the
group is created at ``$`` on each partition stream, so the workers, started next and waited for
(status READING), see nothing; then the group is rewound to 0 on every partition at once (the
cluster-wide form of bench.throughput's one MULTI/EXEC: no worker gets a head start, and the
enqueue is not timed). The bench samples the sum of XLEN over the partition streams (workers
XDEL what they ack) until it reaches 0: tasks/s = tasks / (time from the rewind to the empty
backlog). CPU per task is utime+stime from /proc/<pid>/stat: of the workers together from the
rewind on, of each redis-server over the whole run (enqueue included). This assumes the
cluster-mode worker uses ``--consumer-group`` on every partition stream and keeps a group that
exists. The cluster target fails with a clear message while ``plaita worker`` rejects the
cluster flags (``redis+cluster://`` URL, ``--partitions``); the single-node table still prints.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import redis
from redis.cluster import ClusterNode as StartupNode
from redis.cluster import RedisCluster

from bench.common import Progress, WorkerProcess, body, cpu_seconds, exit_on_sigterm, fields
from tests.support.redis_cluster import ClusterServers
from tests.support.redis_server import RedisServer

CLUSTER_SCHEME = "redis+cluster://"
PROCESSES = (1, 2, 4)
GROUP = "bench-cluster"
#: How often the bench samples XLEN while the workers consume.
POLL_S = 0.005
#: XADDs per pipeline round trip when enqueueing.
CHUNK = 1000
#: Exit code of ``plaita worker`` for a bad configuration (here: flags it does not know yet).
BAD_CONFIG = 2


class ClusterModeMissing(RuntimeError):
    """``plaita worker`` refused the cluster flags: cluster mode has not landed on this branch."""


# -- the producer side: the agreed key layout -------------------------------------------------


def stream_key(queue: str, partitions: int, i: int) -> str:
    """Partition ``i``'s stream: ``<queue>:{p<i>}`` (the hash tag pins it to one slot); with one
    partition just ``<queue>``, the single-node layout of today."""
    return queue if partitions == 1 else f"{queue}:{{p{i}}}"


def message_key(task: dict[str, Any]) -> str:
    """What picks a task's partition: its execution id, else its body (canonical JSON)."""
    eid = task.get("execution_id")
    return eid if isinstance(eid, str) else json.dumps(task, sort_keys=True, separators=(",", ":"))


def partition_of(key: str, partitions: int) -> int:
    return zlib.crc32(key.encode()) % partitions


def open_client(url: str, *, socket_timeout_s: float = 30.0) -> redis.Redis | RedisCluster:
    """A plain client for ``redis://``, a cluster client for ``redis+cluster://h:p,h:p``."""
    if not url.startswith(CLUSTER_SCHEME):
        return redis.Redis.from_url(url, socket_timeout=socket_timeout_s)
    nodes = []
    for addr in url[len(CLUSTER_SCHEME) :].split("/")[0].split(","):
        host, _, port = addr.rpartition(":")
        nodes.append(StartupNode(host, int(port)))
    return RedisCluster(startup_nodes=nodes, socket_timeout=socket_timeout_s)


def enqueue_partitioned(url: str, queue: str, partitions: int, bodies: Iterable[dict[str, Any]]) -> int:
    """XADD every body to its partition's stream, in pipelines of ``CHUNK``; returns how many.

    The one place that writes tasks: swap its body for ``plaita.store.partitioned.open_queue``
    once that lands (same key layout, so nothing else here changes)."""
    client = open_client(url)
    count = 0
    try:
        pipe = client.pipeline(transaction=False)
        for task in bodies:
            stream = stream_key(queue, partitions, partition_of(message_key(task), partitions))
            pipe.xadd(stream, {"payload": json.dumps(task, separators=(",", ":")), "schema_version": "1"})
            count += 1
            if count % CHUNK == 0:
                pipe.execute()
        pipe.execute()
    finally:
        client.close()
    return count


def backlog(client: redis.Redis | RedisCluster, queue: str, partitions: int) -> int:
    """Sum of XLEN over the partition streams (a missing stream counts 0)."""
    pipe = client.pipeline(transaction=False)
    for i in range(partitions):
        pipe.xlen(stream_key(queue, partitions, i))
    return sum(int(n) for n in pipe.execute())


# -- targets ------------------------------------------------------------------------------


@dataclass
class Target:
    """Where the workers run against: its URL, partitions, redis-server pids and labels, a flush."""

    name: str
    url: str
    partitions: int
    servers: dict[str, int]  # label -> pid
    single: RedisServer | None = None
    cluster: ClusterServers | None = None

    def flush(self) -> None:
        if self.cluster is not None:
            self.cluster.flushall()
        elif self.single is not None:
            c = self.single.client()
            try:
                c.flushall()
            finally:
                c.close()

    def worker_flags(self) -> list[str]:
        return [] if self.partitions == 1 else ["--partitions", str(self.partitions)]


def single_target(server: RedisServer) -> Target:
    assert server.proc is not None
    return Target("single redis-server", server.url, 1, {f"redis {server.port}": server.proc.pid}, single=server)


def cluster_target(cluster: ClusterServers, partitions: int) -> Target:
    pids = cluster.pids()
    labels = {n.port: ("master" if n.is_master else "replica") for n in cluster.nodes()}
    servers = {f"{labels[p]} {p}": pid for p, pid in sorted(pids.items(), key=lambda kv: (labels[kv[0]], kv[0]))}
    return Target(f"cluster 3+3, {partitions} partitions", cluster.url, partitions, servers, cluster=cluster)


# -- one run --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    target: str
    processes: int
    tasks: int
    seconds: float
    tasks_per_s: float
    worker_cpu_us: float
    #: µs of CPU per task of each redis-server, by label ("master 41234").
    server_cpu_us: dict[str, float]


def start_workers(target: Target, queue: str, processes: int, concurrency: int) -> list[WorkerProcess]:
    """Start ``processes`` workers and wait for READING; ClusterModeMissing if they refuse the flags."""
    flags = ["--concurrency", str(concurrency), *target.worker_flags()]
    workers = [
        WorkerProcess(target.url, stream=queue, group=GROUP, consumer_name=f"bench-cl-{i}", extra_args=flags)
        for i in range(processes)
    ]
    try:
        for w in workers:
            w.wait_state("READING")
    except RuntimeError as exc:
        for w in workers:
            w.close()
        refused = any(w.proc.returncode == BAD_CONFIG for w in workers)
        if refused and target.cluster is not None:
            raise ClusterModeMissing(
                f"plaita worker refused the cluster flags (--redis-url {target.url} {' '.join(flags)}): "
                f"exit {BAD_CONFIG}, {str(exc).strip()}. Cluster mode has not landed on this branch yet."
            ) from exc
        raise
    return workers


def hold(target: Target, queue: str) -> None:
    """Create the group at ``$`` on every partition stream after the enqueue: the workers (which
    keep an existing group, BUSYGROUP) start with nothing to read, whatever order they come up in."""
    client = open_client(target.url)
    try:
        for i in range(target.partitions):
            client.xgroup_create(stream_key(queue, target.partitions, i), GROUP, id="$", mkstream=True)
    finally:
        client.close()


def release(target: Target, queue: str, first_n: int) -> int:
    """Rewind the group to ``0`` on every partition (a few ms for all), then XADD one more task to
    each: SETID alone wakes no blocked XREADGROUP, an XADD does. Returns the tasks added."""
    client = open_client(target.url)
    try:
        pipe = client.pipeline(transaction=False)
        for i in range(target.partitions):
            stream = stream_key(queue, target.partitions, i)
            pipe.xgroup_setid(stream, GROUP, "0")
            pipe.xadd(stream, fields(first_n + i))  # type: ignore[arg-type]
        pipe.execute()
    finally:
        client.close()
    return target.partitions


def wait_drained(target: Target, queue: str, workers: list[WorkerProcess], timeout_s: float) -> None:
    """Sample the backlog every ``POLL_S`` until 0; RuntimeError on a worker exit or the deadline."""
    client = open_client(target.url)
    try:
        deadline = time.monotonic() + timeout_s
        while (left := backlog(client, queue, target.partitions)) > 0:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{target.name}: {left} tasks left after {timeout_s} s: {workers[0].stderr_tail()}")
            dead = next((w for w in workers if not w.alive()), None)
            if dead is not None:
                raise RuntimeError(f"{target.name}: worker exited {dead.proc.returncode}: {dead.stderr_tail()}")
            time.sleep(POLL_S)
    finally:
        client.close()


def one_run(target: Target, queue: str, total: int, processes: int, concurrency: int, timeout_s: float) -> Run:
    target.flush()
    s0 = {k: cpu_seconds(p) for k, p in target.servers.items()}
    enqueue_partitioned(target.url, queue, target.partitions, (body(i) for i in range(total)))
    hold(target, queue)
    workers = start_workers(target, queue, processes, concurrency)
    try:
        w0 = sum(cpu_seconds(w.pid) for w in workers)
        t0 = time.monotonic()
        done = total + release(target, queue, total)
        wait_drained(target, queue, workers, timeout_s)
        seconds = time.monotonic() - t0
        w_us = (sum(cpu_seconds(w.pid) for w in workers) - w0) / done * 1e6
        s_us = {k: (cpu_seconds(p) - s0[k]) / done * 1e6 for k, p in target.servers.items()}
        for w in workers:
            if (code := w.terminate()) != 0:
                raise RuntimeError(f"{target.name}: worker exited {code} on SIGTERM: {w.stderr_tail()}")
        return Run(target.name, processes, done, seconds, done / max(seconds, 1e-9), w_us, s_us)
    finally:
        for w in workers:
            w.close()


def series(target: Target, a: argparse.Namespace, progress: Progress) -> list[Run]:
    """1, 2 and 4 processes, ``a.repeats`` rounds interleaved; each keeps its median run."""
    samples: dict[int, list[Run]] = {}
    for round_no in range(a.repeats):
        for procs in PROCESSES:
            queue = f"bench:cluster:{round_no}:{procs}"
            r = one_run(target, queue, a.tasks, procs, a.concurrency, a.timeout_s)
            samples.setdefault(procs, []).append(r)
            progress.step(note=f"{target.name}, {procs} proc: {r.tasks_per_s:,.0f} tasks/s")
    return [sorted(rs, key=lambda r: r.tasks_per_s)[len(rs) // 2] for rs in samples.values()]


# -- report -----------------------------------------------------------------------------------


def table(runs: list[Run], concurrency: int) -> str:
    """Markdown: tasks/s, scaling vs the same target's 1-process run, CPU per task."""
    lines = [
        f"| target | worker processes (--concurrency {concurrency}) | tasks/s | vs 1 process "
        "| worker CPU µs/task | redis CPU µs/task (all servers) | per redis-server µs/task |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    base = {r.target: r.tasks_per_s for r in runs if r.processes == 1}
    for r in runs:
        ratio = r.tasks_per_s / base[r.target] if base.get(r.target) else float("nan")
        each = ", ".join(f"{k}: {v:.1f}" for k, v in r.server_cpu_us.items())
        lines.append(
            f"| {r.target} | {r.processes} | {r.tasks_per_s:,.0f} | {ratio:.2f}x "
            f"| {r.worker_cpu_us:.1f} | {sum(r.server_cpu_us.values()):.1f} | {each} |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.cluster", description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", type=int, default=20_000, help="tasks per run (default 20000)")
    p.add_argument("--concurrency", type=int, default=4, help="--concurrency of each worker (default 4)")
    p.add_argument("--partitions", type=int, default=6, help="partitions on the cluster (default 6)")
    p.add_argument("--repeats", type=int, default=1, help="rounds; each configuration keeps its median (default 1)")
    p.add_argument("--timeout-s", type=float, default=300.0, help="longest wait for one run to drain (default 300)")
    p.add_argument("--only", choices=("single", "cluster"), help="one target only")
    a = p.parse_args(argv)
    if a.tasks < 1 or a.concurrency < 1 or a.partitions < 1 or a.repeats < 1:
        p.error("--tasks, --concurrency, --partitions and --repeats must be >= 1")
    return a


def run_targets(a: argparse.Namespace) -> tuple[list[Run], str | None]:
    """Every run of every target wanted; the error that stopped the cluster target, if any."""
    names = [a.only] if a.only else ["single", "cluster"]
    progress = Progress(f"cluster bench ({a.tasks} tasks per run)", len(names) * len(PROCESSES) * a.repeats)
    runs: list[Run] = []
    if "single" in names:
        with RedisServer(persist=False) as server:
            runs += series(single_target(server), a, progress)
    if "cluster" in names:
        try:
            with ClusterServers(masters=3, replicas_per_master=1) as cluster:
                runs += series(cluster_target(cluster, a.partitions), a, progress)
        except ClusterModeMissing as exc:
            progress.finish()
            return runs, str(exc)
    progress.finish()
    return runs, None


def main(argv: list[str] | None = None) -> int:
    exit_on_sigterm()
    a = parse_args(argv)
    runs, error = run_targets(a)
    print()
    if runs:
        print(table(runs, a.concurrency))
    if error is not None:
        print(f"\nbench.cluster: the cluster target did not run: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
