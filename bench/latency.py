"""End-to-end latency: enqueue (time.time() in the body) to handler start, at a steady offered load."""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import redis

from bench.common import LOG_ENV, HandlerLog, Producer, Progress, WorkerProcess, percentile, wait_for

GROUP = "bench-latency"
#: Longest wait for the last task after the producer stopped.
SETTLE_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class LatencyResult:
    rate_per_s: float
    seconds: float
    concurrency: int
    latencies_s: list[float]
    enqueued: int
    achieved_per_s: float

    @property
    def p50_s(self) -> float:
        return percentile(self.latencies_s, 50)

    @property
    def p99_s(self) -> float:
        return percentile(self.latencies_s, 99)

    @property
    def max_s(self) -> float:
        return max(self.latencies_s)


def run(url: str, rate_per_s: float, seconds: float, concurrency: int = 1) -> LatencyResult:
    client = redis.Redis.from_url(url, socket_timeout=10)
    client.flushdb()
    stream = "bench:latency"
    log_dir = Path(tempfile.mkdtemp(prefix="plaita-bench-latency-"))
    log = HandlerLog(log_dir / "handler.log")
    try:
        with WorkerProcess(
            url,
            stream=stream,
            group=GROUP,
            handler="bench.handlers:record",
            extra_args=["--concurrency", str(concurrency)],
            env={LOG_ENV: str(log.path)},
        ) as worker:
            worker.wait_state("READING")
            progress = Progress(f"latency at {rate_per_s:g} tasks/s", int(seconds))
            producer = Producer(url, stream, rate_per_s, max_s=seconds, socket_timeout_s=10).start()
            t0 = time.monotonic()
            try:
                for _ in range(int(seconds)):
                    time.sleep(max(0.0, t0 + progress.done + 1 - time.monotonic()))
                    log.poll()
                    progress.step(note=f"{len(log.of('S'))} started")
            finally:
                producer.stop()
                producer.close()
            sent = producer.acked_ns()
            if not wait_for(lambda: log.all_finished(sent), SETTLE_TIMEOUT_S, 0.05):
                raise RuntimeError(f"latency: {len(sent - log.finished_ns())} tasks not done: {worker.stderr_tail()}")
            worker.terminate()
        starts = [e for e in log.of("S") if e.delivery == 1]
        lat = [e.wall - e.enqueued_wall for e in starts]
        span = max(e.enqueued_wall for e in starts) - min(e.enqueued_wall for e in starts)
        result = LatencyResult(rate_per_s, seconds, concurrency, lat, len(sent), (len(sent) - 1) / max(span, 1e-9))
        progress.finish(f"p50 {result.p50_s * 1000:.1f} ms, p99 {result.p99_s * 1000:.1f} ms")
        return result
    finally:
        client.close()
        log.path.unlink(missing_ok=True)
        log_dir.rmdir()
