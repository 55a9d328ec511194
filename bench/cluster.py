"""``python -m bench.cluster``: ``plaita worker`` throughput on one redis-server vs a Redis Cluster.

Targets, in one run: (a) one private redis-server, one partition (the plain ``<queue>`` stream of
today); (b) the same server with ``--partitions N`` (default 6: what partitioning costs without a
cluster); (c) a private 3-master + 3-replica cluster, ``--partitions N`` (6 = two per master, the
tags of ``plaita.store.keyspace.partition_tag`` spread evenly). Each with 1, 2 and 4 worker
processes (``--concurrency`` each). Keys come from the queue's keyspace, never by hand.

Per run: a fresh queue and an emptied server; ``open_queue(...).enqueue_many`` routes every task
to its partition, then the group is created at ``$`` on each partition stream, so the workers,
started next and waited for (status READING), see nothing; then the group is rewound to 0 on
every partition at once (the cluster-wide form of bench.throughput's one MULTI/EXEC: no worker
gets a head start, and the enqueue is not timed). The bench samples the sum of XLEN over the
partition streams (workers XDEL what they ack) until it reaches 0, then checks
``is_settled``: tasks/s = tasks / (time from the rewind to the empty backlog). CPU per task is
utime+stime from /proc/<pid>/stat: of the workers together from the rewind on, of each
redis-server over the whole run (the enqueue included: a producer's XADD is part of a task's cost).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from dataclasses import dataclass

from bench.common import Progress, WorkerProcess, body, cpu_seconds, exit_on_sigterm, fields
from bench.report import machine
from plaita.config import Settings
from plaita.store.stats import is_settled
from plaita.store.streams.partitioned import open_queue
from plaita.store.streams.queue import StreamQueue
from tests.support.redis_cluster import ClusterServers
from tests.support.redis_server import RedisServer

PROCESSES = (1, 2, 4)
GROUP = "bench-cluster"
#: How often the bench samples XLEN while the workers consume.
POLL_S = 0.005
#: Bodies per ``enqueue_many`` call (one pipeline per partition each): bounds the client's buffers.
CHUNK = 6000
TARGETS = ("single", "single-partitioned", "cluster")


# -- the producer side: plaita's own queue and keyspace ------------------------------------


def bench_queue(url: str, queue: str, partitions: int) -> StreamQueue:
    """The queue as a producer sees it: plain keys for one partition on redis://, else hash-tagged."""
    return open_queue(
        Settings(redis_url=url, queue_name=queue, consumer_group=GROUP, partitions=partitions, consumer_name="bench")
    )


def enqueue(q: StreamQueue, total: int) -> int:
    """Tasks 0..total-1, each to its partition (``enqueue_many`` routes); returns how many."""
    for lo in range(0, total, CHUNK):
        q.enqueue_many([body(i) for i in range(lo, min(lo + CHUNK, total))])
    return total


def streams(q: StreamQueue) -> list[str]:
    return [q.keyspace.stream(p) for p in range(q.keyspace.partitions)]


def backlog(q: StreamQueue) -> int:
    """Sum of XLEN over the partition streams (a missing stream counts 0): one pipeline, so the
    5 ms sampling costs the servers little next to the tasks."""
    pipe = q.client.pipeline(transaction=False)
    for stream in streams(q):
        pipe.xlen(stream)
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


def single_target(server: RedisServer, partitions: int) -> Target:
    assert server.proc is not None
    name = f"single redis-server, {partitions} partition{'s' * (partitions > 1)}"
    return Target(name, server.url, partitions, {f"redis {server.port}": server.proc.pid}, single=server)


def cluster_target(cluster: ClusterServers, partitions: int) -> Target:
    pids = cluster.pids()
    labels = {n.port: ("master" if n.is_master else "replica") for n in cluster.nodes()}
    servers = {f"{labels[p]} {p}": pid for p, pid in sorted(pids.items(), key=lambda kv: (labels[kv[0]], kv[0]))}
    return Target(f"cluster 3+3, {partitions} partitions", cluster.url, partitions, servers, cluster=cluster)


def spread(target: Target) -> str:
    """Which master owns how many partition streams (the slot follows the hash tag alone)."""
    if target.cluster is None:
        return ""
    q = bench_queue(target.url, "bench:cluster:spread", target.partitions)
    try:
        owners = Counter(target.cluster.master_of_key(s).port for s in streams(q))
    finally:
        q.close()
    return ", ".join(f"master {port}: {n}" for port, n in sorted(owners.items()))


# -- one run --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    target: str
    processes: int
    tasks: int
    seconds: float
    tasks_per_s: float
    worker_cpu_us: float
    #: µs of CPU per task of each redis-server over the whole run, by label ("master 41234").
    server_cpu_us: dict[str, float]
    #: µs of CPU per task of all redis-servers together from the rewind on (the timed window).
    drain_server_cpu_us: float


def start_workers(target: Target, queue: str, processes: int, concurrency: int) -> list[WorkerProcess]:
    """Start ``processes`` workers (in parallel) and wait until each reports READING."""
    flags = ["--concurrency", str(concurrency), *target.worker_flags()]
    workers = [
        WorkerProcess(target.url, stream=queue, group=GROUP, consumer_name=f"bench-cl-{i}", extra_args=flags)
        for i in range(processes)
    ]
    try:
        for w in workers:
            w.wait_state("READING")
    except BaseException:
        for w in workers:
            w.close()
        raise
    return workers


def hold(q: StreamQueue) -> None:
    """Create the group at ``$`` on every partition stream after the enqueue: the workers (which
    keep an existing group, BUSYGROUP) start with nothing to read, whatever order they come up in."""
    for stream in streams(q):
        q.client.xgroup_create(stream, GROUP, id="$", mkstream=True)


def release(q: StreamQueue, first_n: int) -> int:
    """Rewind the group to ``0`` on every partition (one pipeline: a few ms for all), then XADD one
    more task to each: SETID alone wakes no blocked XREADGROUP, an XADD does. Returns the tasks added."""
    pipe = q.client.pipeline(transaction=False)
    for i, stream in enumerate(streams(q)):
        pipe.xgroup_setid(stream, GROUP, "0")
        pipe.xadd(stream, fields(first_n + i))  # type: ignore[arg-type]
    pipe.execute()
    return q.keyspace.partitions


def wait_drained(target: Target, q: StreamQueue, workers: list[WorkerProcess], timeout_s: float) -> None:
    """Sample the backlog every ``POLL_S`` until 0; RuntimeError on a worker exit or the deadline,
    or when entries are still pending once the streams are empty (an ack that did not land)."""
    deadline = time.monotonic() + timeout_s
    while (left := backlog(q)) > 0:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{target.name}: {left} tasks left after {timeout_s} s: {workers[0].stderr_tail()}")
        dead = next((w for w in workers if not w.alive()), None)
        if dead is not None:
            raise RuntimeError(f"{target.name}: worker exited {dead.proc.returncode}: {dead.stderr_tail()}")
        time.sleep(POLL_S)
    if not is_settled(q):
        raise RuntimeError(f"{target.name}: streams empty but entries still pending")


def one_run(target: Target, queue: str, total: int, processes: int, concurrency: int, timeout_s: float) -> Run:
    target.flush()
    s0 = {k: cpu_seconds(p) for k, p in target.servers.items()}
    q = bench_queue(target.url, queue, target.partitions)
    workers: list[WorkerProcess] = []
    try:
        enqueue(q, total)
        hold(q)
        workers = start_workers(target, queue, processes, concurrency)
        w0 = sum(cpu_seconds(w.pid) for w in workers)
        d0 = sum(cpu_seconds(p) for p in target.servers.values())
        t0 = time.monotonic()
        done = total + release(q, total)
        wait_drained(target, q, workers, timeout_s)
        seconds = time.monotonic() - t0
        w_us = (sum(cpu_seconds(w.pid) for w in workers) - w0) / done * 1e6
        s_us = {k: (cpu_seconds(p) - s0[k]) / done * 1e6 for k, p in target.servers.items()}
        d_us = (sum(cpu_seconds(p) for p in target.servers.values()) - d0) / done * 1e6
        for w in workers:
            if (code := w.terminate()) != 0:
                raise RuntimeError(f"{target.name}: worker exited {code} on SIGTERM: {w.stderr_tail()}")
        return Run(target.name, processes, done, seconds, done / max(seconds, 1e-9), w_us, s_us, d_us)
    finally:
        for w in workers:
            w.close()
        q.close()


def series(target: Target, a: argparse.Namespace, progress: Progress) -> list[Run]:
    """1, 2 and 4 processes, ``a.repeats`` rounds interleaved; each keeps its median run."""
    samples: dict[int, list[Run]] = {}
    for round_no in range(a.repeats):
        for procs in a.processes:
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
        "| worker CPU µs/task | redis CPU µs/task, all servers (of it in the timed drain) "
        "| per redis-server µs/task |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    base = {r.target: r.tasks_per_s for r in runs if r.processes == 1}
    for r in runs:
        ratio = r.tasks_per_s / base[r.target] if base.get(r.target) else float("nan")
        each = ", ".join(f"{k}: {v:.1f}" for k, v in r.server_cpu_us.items())
        lines.append(
            f"| {r.target} | {r.processes} | {r.tasks_per_s:,.0f} | {ratio:.2f}x "
            f"| {r.worker_cpu_us:.1f} | {sum(r.server_cpu_us.values()):.1f} ({r.drain_server_cpu_us:.1f}) | {each} |"
        )
    return "\n".join(lines)


def process_counts(text: str) -> tuple[int, ...]:
    counts = tuple(int(x) for x in text.split(","))
    if not counts or min(counts) < 1 or max(counts) > 16:
        raise argparse.ArgumentTypeError("worker process counts must be within 1..16")
    return counts


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.cluster", description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", type=int, default=20_000, help="tasks per run (default 20000)")
    p.add_argument("--concurrency", type=int, default=4, help="--concurrency of each worker (default 4)")
    p.add_argument("--partitions", type=int, default=6, help="partitions of the partitioned targets (default 6)")
    p.add_argument("--processes", type=process_counts, default=PROCESSES, help="worker process counts (default 1,2,4)")
    p.add_argument("--repeats", type=int, default=1, help="rounds; each configuration keeps its median (default 1)")
    p.add_argument("--timeout-s", type=float, default=300.0, help="longest wait for one run to drain (default 300)")
    p.add_argument("--only", choices=TARGETS, action="append", help="these targets only (repeatable)")
    a = p.parse_args(argv)
    if a.tasks < 1 or a.concurrency < 1 or a.partitions < 2 or a.repeats < 1:
        p.error("--tasks, --concurrency and --repeats must be >= 1, --partitions >= 2")
    return a


def run_targets(a: argparse.Namespace) -> list[Run]:
    """Every run of every target wanted, the single-server ones on one server (flushed per run)."""
    names = a.only or list(TARGETS)
    progress = Progress(f"cluster bench ({a.tasks} tasks per run)", len(names) * len(a.processes) * a.repeats)
    runs: list[Run] = []
    singles = [p for name, p in (("single", 1), ("single-partitioned", a.partitions)) if name in names]
    if singles:
        with RedisServer(persist=False) as server:
            for partitions in singles:
                runs += series(single_target(server, partitions), a, progress)
    if "cluster" in names:
        with ClusterServers(masters=3, replicas_per_master=1) as cluster:
            target = cluster_target(cluster, a.partitions)
            print(f"  {target.name}: partition streams per master: {spread(target)}", flush=True)
            runs += series(target, a, progress)
    progress.finish()
    return runs


def run_line() -> str:
    """Where and when (the numbers only mean something next to nproc and the load)."""
    m = machine()
    return (
        f"Run: {m['date']} · commit `{m['commit']}` · nproc {m['nproc']} ({m['cpu']}) · "
        f"redis-server {m['redis-server']} · redis-py {m['redis-py']} · load average at start {m['load']}"
    )


def main(argv: list[str] | None = None) -> int:
    exit_on_sigterm()
    a = parse_args(argv)
    started = run_line()
    runs = run_targets(a)
    print()
    print(started)
    print()
    print(table(runs, a.concurrency))
    return 0


if __name__ == "__main__":
    sys.exit(main())
