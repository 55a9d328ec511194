"""Idle SIGTERM shutdown latency of ``plaita worker`` subprocesses."""

from __future__ import annotations

import signal
import statistics
import subprocess
import time
from dataclasses import dataclass

from bench.common import WorkerProcess

#: A trial whose worker has not exited this long after SIGTERM counts as failed (then SIGKILL).
EXIT_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class ShutdownResult:
    """Seconds from SIGTERM to process exit, one per trial, and the exit codes."""

    latencies_s: list[float]
    exit_codes: list[int]

    @property
    def max_s(self) -> float:
        return max(self.latencies_s)

    @property
    def median_s(self) -> float:
        return statistics.median(self.latencies_s)


def one_trial(url: str, stream: str, settle_s: float) -> tuple[float, int]:
    """Start a worker, wait READING (+``settle_s`` so it sits in a BLOCK), SIGTERM, time the exit."""
    with WorkerProcess(url, stream=stream, group="bench-shutdown") as worker:
        worker.wait_state("READING")
        time.sleep(settle_s)  # land somewhere inside a BLOCK, not right at its start
        t_kill = time.monotonic()
        worker.proc.send_signal(signal.SIGTERM)
        try:
            worker.proc.wait(EXIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return EXIT_TIMEOUT_S, -9
        return time.monotonic() - t_kill, int(worker.proc.returncode)


def run(url: str, trials: int) -> ShutdownResult:
    latencies: list[float] = []
    codes: list[int] = []
    for i in range(trials):
        # Spread the signal over the 500 ms BLOCK window: 0.05, 0.15, ... s after READING.
        latency, code = one_trial(url, "bench:shutdown", settle_s=0.05 + (i % 5) * 0.1)
        latencies.append(latency)
        codes.append(code)
    return ShutdownResult(latencies, codes)
