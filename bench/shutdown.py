"""SIGTERM shutdown latency of idle ``plaita worker`` subprocesses, a new worker per trial: with
Redis answering, and with Redis frozen (SIGSTOP) for a while before the signal."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from bench.common import Progress, WorkerProcess, median, percentile

#: A trial whose worker has not exited this long after SIGTERM counts as failed (then SIGKILL).
EXIT_TIMEOUT_S = 10.0
#: SIGTERM lands this long after READING: spread over the 500 ms BLOCK window.
SETTLE_STEPS_S = (0.05, 0.15, 0.25, 0.35, 0.45)
#: How long Redis is frozen before the SIGTERM (the worker is then blocked on it, or backing off).
FROZEN_FOR_S = (0.3, 0.8, 1.5, 2.2, 3.5)


class Freezable(Protocol):
    url: str

    def freeze(self) -> None: ...

    def thaw(self) -> None: ...


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
        return median(self.latencies_s)

    @property
    def p95_s(self) -> float:
        return percentile(self.latencies_s, 95)


def _time_sigterm(worker: WorkerProcess) -> tuple[float, int]:
    """SIGTERM ``worker``; (seconds to its exit, exit code), or (timeout, -9) if it hangs."""
    t_kill = time.monotonic()
    worker.proc.send_signal(signal.SIGTERM)
    try:
        worker.proc.wait(EXIT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return EXIT_TIMEOUT_S, -9
    return time.monotonic() - t_kill, int(worker.proc.returncode)


def one_trial(url: str, stream: str, settle_s: float) -> tuple[float, int]:
    """Start a worker, wait READING (+``settle_s`` so it sits in a BLOCK), SIGTERM, time the exit."""
    with WorkerProcess(url, stream=stream, group="bench-shutdown") as worker:
        worker.wait_state("READING")
        time.sleep(settle_s)  # land somewhere inside a BLOCK, not right at its start
        return _time_sigterm(worker)


def _trials(title: str, trials: int, trial: Callable[[int], tuple[float, int]]) -> ShutdownResult:
    """Run ``trial(i)`` ``trials`` times with a progress line; collect latencies and exit codes."""
    latencies: list[float] = []
    codes: list[int] = []
    progress = Progress(title, trials)
    for i in range(trials):
        latency, code = trial(i)
        latencies.append(latency)
        codes.append(code)
        progress.step(note=f"{latency * 1000:.0f} ms, exit {code}")
    result = ShutdownResult(latencies, codes)
    progress.finish(f"max {result.max_s * 1000:.0f} ms, median {result.median_s * 1000:.0f} ms")
    return result


def run(url: str, trials: int) -> ShutdownResult:
    return _trials(
        "idle SIGTERM -> exit",
        trials,
        lambda i: one_trial(url, "bench:shutdown", SETTLE_STEPS_S[i % len(SETTLE_STEPS_S)]),
    )


def one_frozen_trial(server: Freezable, stream: str, frozen_for_s: float) -> tuple[float, int]:
    """Start a worker, wait READING, SIGSTOP Redis, wait ``frozen_for_s``, SIGTERM, time the exit."""
    with WorkerProcess(server.url, stream=stream, group="bench-shutdown-frozen") as worker:
        worker.wait_state("READING")
        server.freeze()
        try:
            time.sleep(frozen_for_s)  # the fault's duration, not synchronisation
            return _time_sigterm(worker)
        finally:
            server.thaw()


def run_frozen(server: Freezable, trials: int) -> ShutdownResult:
    return _trials(
        "SIGTERM with Redis frozen -> exit",
        trials,
        lambda i: one_frozen_trial(server, "bench:shutdown-frozen", FROZEN_FOR_S[i % len(FROZEN_FOR_S)]),
    )
