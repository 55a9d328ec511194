"""Throughput: the raw redis-py loop vs ``plaita worker`` (no-op handler), 1/2/4 processes, concurrency 1/4/16.

Every run gets a fresh stream. The consumers start first and are waited for (raw: it shows
up in XINFO CONSUMERS; worker: status READING), then all tasks arrive in one MULTI/EXEC, so
no consumer gets a head start. Completions are observed by sampling XLEN every 5 ms (every
consumer XDELs what it acks); the rate counts completions after the first observed one over
the time to the last (start-up and the enqueue itself excluded, the same for both).
After the single-process default-concurrency run the same worker, now idle, is measured for
CPU over ``idle_s`` and for peak RSS (VmHWM).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import redis

from bench.common import (
    Progress,
    Subprocess,
    WorkerProcess,
    cpu_seconds,
    enqueue,
    group_pending,
    scan_calls,
    start_all,
    status_kb,
    wait_fleet_checked,
    wait_for,
)

#: How often the bench samples XLEN while consumers work.
POLL_S = 0.005
PROCESSES = (1, 2, 4)
CONCURRENCIES = (1, 4, 16)
#: The worker measured idle after its throughput run.
IDLE_CONCURRENCY = 1
#: Extra single-process runs whose bodies carry an ``execution_id`` (leased before they run).
EXECUTION_ID_CONCURRENCIES = (1, 4)
GROUP = "bench-throughput"


@dataclass(frozen=True)
class Throughput:
    """One run: ``concurrency`` 0 = the raw loop."""

    processes: int
    concurrency: int
    tasks: int
    seconds: float
    tasks_per_s: float
    vmhwm_kb: list[int] = field(default_factory=list)
    #: Bodies carry an ``execution_id``, so the worker takes a lease per task (one round trip per read batch).
    execution_ids: bool = False
    #: Every repeat's tasks/s (this run is the median one).
    rates: list[float] = field(default_factory=list)
    #: CPU (utime+stime) per task of the consumer processes together, and of redis-server.
    cpu_us_per_task: float = 0.0
    redis_cpu_us_per_task: float = 0.0

    @property
    def raw(self) -> bool:
        return self.concurrency == 0

    @property
    def label(self) -> str:
        procs = f"{self.processes} process{'es' if self.processes > 1 else ''}"
        if self.raw:
            return f"raw loop, {procs}"
        eid = ", bodies with execution_id" if self.execution_ids else ""
        return f"worker --concurrency {self.concurrency}, {procs}{eid}"


@dataclass(frozen=True)
class Idle:
    """One idle worker: CPU over ``seconds`` and its memory."""

    concurrency: int
    seconds: float
    cpu_s: float
    vmhwm_kb: int
    vmrss_kb: int

    @property
    def cpu_percent(self) -> float:
        return 100.0 * self.cpu_s / self.seconds


@dataclass
class ThroughputResult:
    runs: list[Throughput]
    idle: Idle | None

    def get(self, processes: int, concurrency: int, *, execution_ids: bool = False) -> Throughput | None:
        return next(
            (
                r
                for r in self.runs
                if r.processes == processes and r.concurrency == concurrency and r.execution_ids == execution_ids
            ),
            None,
        )

    @property
    def raw1(self) -> float:
        r = self.get(1, 0)
        assert r is not None
        return r.tasks_per_s


def _drain(
    client: redis.Redis, stream: str, total: int, procs: list[Subprocess], label: str, timeout_s: float, t_enq: float
) -> tuple[float, float]:
    """Sample XLEN until the stream is empty and nothing is pending; (seconds, tasks/s).

    Counts from the first sample that saw a completion; if more than half were already done by
    then (a tiny run), from ``t_enq`` (just before the enqueue) instead.
    """
    t_first: float | None = None
    done_at_first = 0
    deadline = time.monotonic() + timeout_s
    while True:
        now = time.monotonic()
        if now > deadline:
            raise RuntimeError(f"{label}: stream not drained after {timeout_s} s: {procs[0].stderr_tail()}")
        for p in procs:
            if not p.alive():
                raise RuntimeError(f"{label}: pid {p.pid} exited with {p.proc.returncode}: {p.stderr_tail()}")
        length = int(client.xlen(stream))
        stamp = time.monotonic()
        done = total - length
        if t_first is None and done > 0:
            t_first, done_at_first = stamp, done
        if length == 0 and group_pending(client, stream, GROUP) == 0:
            assert t_first is not None
            if total - done_at_first < total / 2:
                return stamp - t_enq, total / max(stamp - t_enq, 1e-9)
            elapsed = max(stamp - t_first, 1e-9)
            return stamp - t_first, (total - done_at_first) / elapsed
        time.sleep(POLL_S)


def _cpu(pids: list[int]) -> float:
    return sum(cpu_seconds(pid) for pid in pids)


def raw_run(
    url: str, client: redis.Redis, stream: str, total: int, processes: int, timeout_s: float, redis_pid: int
) -> Throughput:
    client.xgroup_create(stream, GROUP, id="0", mkstream=True)
    procs = [
        Subprocess([sys.executable, "-m", "bench.rawloop", url, stream, GROUP, f"raw-{i}"], prefix="plaita-bench-raw-")
        for i in range(processes)
    ]
    try:
        if not wait_for(lambda: len(client.xinfo_consumers(stream, GROUP)) >= processes, 20):
            raise RuntimeError(f"raw loops not reading after 20 s: {procs[0].stderr_tail()}")
        pids = [p.pid for p in procs]
        cpu0, rcpu0 = _cpu(pids), cpu_seconds(redis_pid)
        t_enq = time.monotonic()
        enqueue(client, stream, total, atomic=True)
        seconds, rate = _drain(client, stream, total, procs, f"raw x{processes}", timeout_s, t_enq)
        cpu_us = (_cpu(pids) - cpu0) / total * 1e6
        rcpu_us = (cpu_seconds(redis_pid) - rcpu0) / total * 1e6
        for p in procs:
            p.terminate()
        return Throughput(processes, 0, total, seconds, rate, cpu_us_per_task=cpu_us, redis_cpu_us_per_task=rcpu_us)
    finally:
        for p in procs:
            p.close()


def worker_run(
    url: str,
    client: redis.Redis,
    stream: str,
    total: int,
    processes: int,
    concurrency: int,
    timeout_s: float,
    after: Callable[[WorkerProcess], None] | None = None,
    execution_ids: bool = False,
    redis_pid: int = 0,
) -> Throughput:
    scans0 = scan_calls(client)  # before the workers start: their first fleet check comes ~1 s later
    workers = [
        WorkerProcess(
            url,
            stream=stream,
            group=GROUP,
            consumer_name=f"bench-tp-{i}",
            extra_args=["--concurrency", str(concurrency)],
        )
        for i in range(processes)
    ]
    label = f"worker c{concurrency} x{processes}"
    try:
        start_all(workers)
        wait_fleet_checked(client, processes, scans0)
        pids = [w.pid for w in workers]
        cpu0, rcpu0 = _cpu(pids), cpu_seconds(redis_pid)
        t_enq = time.monotonic()
        enqueue(client, stream, total, atomic=True, execution_ids=execution_ids)
        seconds, rate = _drain(client, stream, total, list(workers), label, timeout_s, t_enq)
        cpu_us = (_cpu(pids) - cpu0) / total * 1e6
        rcpu_us = (cpu_seconds(redis_pid) - rcpu0) / total * 1e6
        hwm = [status_kb(w.pid, "VmHWM") for w in workers]
        if after is not None:
            after(workers[0])
        for w in workers:
            code = w.terminate()
            if code != 0:
                raise RuntimeError(f"{label}: worker exited {code}: {w.stderr_tail()}")
        return Throughput(
            processes, concurrency, total, seconds, rate, hwm, execution_ids,
            cpu_us_per_task=cpu_us, redis_cpu_us_per_task=rcpu_us,
        )  # fmt: skip
    finally:
        for w in workers:
            w.close()


def measure_idle(worker: WorkerProcess, idle_s: float, concurrency: int) -> Idle:
    """CPU time of an idle (READING, empty stream) worker over ``idle_s``, then its VmHWM/VmRSS."""
    worker.wait_state("READING")
    progress = Progress(f"idle CPU of one worker ({idle_s:g} s)", max(1, int(idle_s // 5)))
    t0, c0 = time.monotonic(), cpu_seconds(worker.pid)
    end = t0 + idle_s
    while (now := time.monotonic()) < end:
        time.sleep(min(5.0, end - now))
        if not worker.alive():
            raise RuntimeError(f"idle worker exited: {worker.stderr_tail()}")
        progress.step()
    t1, c1 = time.monotonic(), cpu_seconds(worker.pid)
    idle = Idle(concurrency, t1 - t0, c1 - c0, status_kb(worker.pid, "VmHWM"), status_kb(worker.pid, "VmRSS"))
    progress.finish(f"{idle.cpu_percent:.3f} % of a core, VmHWM {idle.vmhwm_kb / 1024:.1f} MB")
    return idle


def run(
    url: str, redis_pid: int, total: int, idle_s: float, repeats: int = 1, timeout_s: float = 300.0
) -> ThroughputResult:
    """Every configuration ``repeats`` times, interleaved (round by round); each keeps its median run."""
    client = redis.Redis.from_url(url, socket_timeout=30)
    samples: dict[tuple[int, int, bool], list[Throughput]] = {}
    idle: list[Idle] = []
    plan = [(p, 0, False) for p in PROCESSES] + [(p, c, False) for c in CONCURRENCIES for p in PROCESSES]
    plan += [(1, c, True) for c in EXECUTION_ID_CONCURRENCIES]
    progress = Progress(f"throughput ({total} tasks per run, {repeats} rounds)", len(plan) * repeats)
    try:
        for round_no in range(repeats):
            for i, (procs, conc, eid) in enumerate(plan):
                stream = f"bench:tp:{round_no}:{i}"
                client.flushdb()  # a private server: leases and fences of earlier runs go too
                try:
                    if conc == 0:
                        r = raw_run(url, client, stream, total, procs, timeout_s, redis_pid)
                    else:
                        after = None
                        if procs == 1 and conc == IDLE_CONCURRENCY and idle_s > 0 and not eid and round_no == 0:

                            def after(w: WorkerProcess, c: int = conc) -> None:
                                idle.append(measure_idle(w, idle_s, c))

                        r = worker_run(url, client, stream, total, procs, conc, timeout_s, after, eid, redis_pid)
                finally:
                    client.delete(stream, f"{stream}:dlq")
                samples.setdefault((procs, conc, eid), []).append(r)
                progress.step(note=f"{r.label}: {r.tasks_per_s:,.0f} tasks/s")
        progress.finish()
    finally:
        client.close()
    runs = []
    for key in plan:
        rs = sorted(samples[key], key=lambda r: r.tasks_per_s)
        mid = rs[len(rs) // 2]
        hwm = [max(kbs) for kbs in zip(*(r.vmhwm_kb for r in rs), strict=True)] if mid.vmhwm_kb else []
        rates = [r.tasks_per_s for r in samples[key]]
        runs.append(replace(mid, vmhwm_kb=hwm, rates=rates))
    return ThroughputResult(runs, idle[0] if idle else None)
