"""Recovery after a Redis fault, on a steady trickle: freeze (SIGSTOP), kill -9 + restart with
its data, and a proxy blackhole between worker and Redis, each ``fault_s`` long, ``trials`` times.

One worker per fault kind (default settings, ``bench.handlers:record``), a producer at
TRICKLE_PER_S connected straight to Redis (never through the proxy). Recovery time = from
Redis returning (SIGCONT; the restarted server answering PING; the proxy forwarding again)
to the first handler completion stamped after it. The first trial of each kind also gives a
timeline: completions per 100 ms around the fault. At the end every task the producer got an
id for must have completed (``lost`` otherwise), and executions beyond one per task count as
duplicates.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.common import LOG_ENV, HandlerLog, Producer, Progress, WorkerProcess, median, percentile, wait_for
from tests.support.proxy import FaultProxy
from tests.support.redis_server import RedisServer

FAULTS = ("freeze", "kill", "blackhole")
FAULT_TITLES = {
    "freeze": "freeze (SIGSTOP)",
    "kill": "kill -9 + restart with data",
    "blackhole": "proxy blackhole",
}
#: Offered load during the recovery runs.
TRICKLE_PER_S = 200.0
#: Completions required after a recovery (and before the first fault) before the next fault.
STEADY_COMPLETIONS = 50
STEADY_TIMEOUT_S = 30.0
#: Longest wait for the first completion after Redis returned before the trial counts as failed.
RECOVERY_TIMEOUT_S = 30.0
#: Quiet time kept after each recovery so the timeline shows the catch-up.
TAIL_S = 1.0
TIMELINE_BEFORE_S = 2.0
TIMELINE_AFTER_S = 4.0
BIN_S = 0.1
#: Longest wait for every task after the producer stopped.
SETTLE_TIMEOUT_S = 60.0
#: A worker that exits on its own is restarted at most this often (each exit is counted).
MAX_RESTARTS = 3
GROUP = "bench-recovery"


@dataclass(frozen=True)
class Trial:
    fault_s: float
    recovery_s: float
    state_at_return: str | None


@dataclass
class FaultResult:
    fault: str
    trials: list[Trial]
    enqueued: int = 0
    uncertain: int = 0
    lost: int = 0
    duplicates: int = 0
    exit_code: int | None = None
    unexpected_exits: list[int] = field(default_factory=list)
    #: (seconds relative to the fault start, completions in that 100 ms bin) of the first trial.
    timeline: list[tuple[float, int]] = field(default_factory=list)
    window_s: tuple[float, float] = (0.0, 0.0)
    recovery_at_s: float = 0.0

    @property
    def recoveries_s(self) -> list[float]:
        return [t.recovery_s for t in self.trials]

    @property
    def median_s(self) -> float:
        return median(self.recoveries_s)

    @property
    def p95_s(self) -> float:
        return percentile(self.recoveries_s, 95)

    @property
    def max_s(self) -> float:
        return max(self.recoveries_s)


class _Rig:
    """A server (with a proxy for the blackhole), a worker and its handler log."""

    def __init__(self, fault: str, log: HandlerLog) -> None:
        self.fault = fault
        self.log = log
        self.server = RedisServer(persist=fault == "kill").start()
        self.proxy = FaultProxy(self.server.port) if fault == "blackhole" else None
        self.worker_url = self.proxy.url if self.proxy is not None else self.server.url
        self.worker: WorkerProcess | None = None
        self.exits: list[int] = []

    def start_worker(self) -> WorkerProcess:
        self.worker = WorkerProcess(
            self.worker_url,
            stream="bench:recovery",
            group=GROUP,
            consumer_name=f"bench-recovery-{self.fault}",
            handler="bench.handlers:record",
            env={LOG_ENV: str(self.log.path)},
        )
        return self.worker

    def check_worker(self) -> None:
        """Count an exit nobody asked for and start a new worker (bounded)."""
        assert self.worker is not None
        if self.worker.alive():
            return
        self.exits.append(int(self.worker.proc.returncode))
        self.worker.close()
        if len(self.exits) > MAX_RESTARTS:
            raise RuntimeError(f"recovery/{self.fault}: the worker exited {len(self.exits)} times")
        self.start_worker().wait_state("READING")

    def fault_for(self, fault_s: float) -> float:
        """Apply the fault, hold it ``fault_s``, end it; returns the monotonic time Redis was back."""
        if self.fault == "freeze":
            self.server.freeze()
            try:
                time.sleep(fault_s)
            finally:
                self.server.thaw()
        elif self.fault == "kill":
            self.server.kill()
            time.sleep(fault_s)
            self.server.start()  # returns once the restarted server answers PING
        else:
            assert self.proxy is not None
            self.proxy.blackhole()
            try:
                time.sleep(fault_s)
            finally:
                self.proxy.restore()
        return time.monotonic()

    def worker_tail(self) -> str:
        return self.worker.stderr_tail() if self.worker is not None else ""

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()
        if self.proxy is not None:
            self.proxy.close()
        self.server.stop()


def _completions_after(log: HandlerLog, t: float) -> list[float]:
    log.poll()
    return [e.mono for e in log.events if e.kind == "E" and e.mono > t]


def _timeline(log: HandlerLog, t_fault: float, t_return: float) -> list[tuple[float, int]]:
    lo, hi = t_fault - TIMELINE_BEFORE_S, t_return + TIMELINE_AFTER_S
    bins = [0] * int((hi - lo) / BIN_S + 1)
    for e in log.events:
        if e.kind == "E" and lo <= e.mono < hi:
            bins[int((e.mono - lo) / BIN_S)] += 1
    return [(round(lo - t_fault + i * BIN_S, 3), c) for i, c in enumerate(bins)]


def run_fault(fault: str, trials: int, fault_s: float) -> FaultResult:
    log_dir = Path(tempfile.mkdtemp(prefix="plaita-bench-recovery-"))
    log = HandlerLog(log_dir / "handler.log")
    rig = _Rig(fault, log)
    result = FaultResult(fault, [])
    producer: Producer | None = None
    progress = Progress(f"recovery: {FAULT_TITLES[fault]} {fault_s:g} s", trials)
    try:
        rig.start_worker().wait_state("READING")
        budget_s = trials * (fault_s + STEADY_TIMEOUT_S + RECOVERY_TIMEOUT_S + TIMELINE_AFTER_S) + 60
        producer = Producer(rig.server.url, "bench:recovery", TRICKLE_PER_S, max_s=budget_s).start()
        since = time.monotonic()
        time.sleep(TIMELINE_BEFORE_S + 0.5)  # a steady stretch before the first fault, for the timeline
        for i in range(trials):

            def steady(s: float = since) -> bool:
                return len(_completions_after(log, s)) >= STEADY_COMPLETIONS

            if not wait_for(steady, STEADY_TIMEOUT_S):
                raise RuntimeError(f"recovery/{fault}: worker not consuming steadily: {rig.worker_tail()}")
            rig.check_worker()
            t_fault = time.monotonic()
            t_return = rig.fault_for(fault_s)
            assert rig.worker is not None
            state = rig.worker.state()

            def resumed(t: float = t_return) -> bool:
                return bool(_completions_after(log, t))

            if not wait_for(resumed, RECOVERY_TIMEOUT_S):
                raise RuntimeError(f"recovery/{fault}: nothing completed {RECOVERY_TIMEOUT_S} s after Redis returned")
            first = min(_completions_after(log, t_return))
            result.trials.append(Trial(t_return - t_fault, first - t_return, state))
            time.sleep(TIMELINE_AFTER_S if i == 0 else TAIL_S)
            if i == 0:
                log.poll()
                result.timeline = _timeline(log, t_fault, t_return)
                result.window_s = (0.0, t_return - t_fault)
                result.recovery_at_s = first - t_fault
            rig.check_worker()
            since = time.monotonic()
            progress.step(note=f"recovered in {(first - t_return) * 1000:.0f} ms (state at return: {state})")
        producer.stop()
        sent = producer.acked_ns()
        wait_for(lambda: log.all_finished(sent), SETTLE_TIMEOUT_S, 0.05)  # else: lost > 0, reported
        rig.check_worker()
        assert rig.worker is not None
        result.exit_code = rig.worker.terminate()
        log.poll()
        result.enqueued = len(sent)
        result.uncertain = len(producer.uncertain)
        result.lost = len(sent - log.finished_ns())
        result.duplicates = log.duplicates()
        result.unexpected_exits = list(rig.exits)
        progress.finish(
            f"median {result.median_s * 1000:.0f} ms, p95 {result.p95_s * 1000:.0f} ms, "
            f"max {result.max_s * 1000:.0f} ms;"
            f" {result.enqueued} tasks, {result.lost} lost, {result.duplicates} duplicates"
        )
        return result
    finally:
        if producer is not None:
            producer.close()
        rig.close()
        log.path.unlink(missing_ok=True)
        log_dir.rmdir()


def run(trials: int, fault_s: float) -> list[FaultResult]:
    return [run_fault(f, trials, fault_s) for f in FAULTS]
