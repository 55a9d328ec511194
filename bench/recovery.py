"""Recovery after a freeze: a worker on a steady trickle, the server SIGSTOPped, then SIGCONTed."""

from __future__ import annotations

import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from bench.common import WorkerProcess, fields
from tests.support.redis_server import RedisServer

#: One task every this many seconds from the bench (the trickle).
TRICKLE_EVERY_S = 0.05
#: Stamps seen before the freeze, so the worker is known to be consuming steadily.
STEADY_STAMPS = 20
#: Longest wait for the first completion after the thaw before the trial counts as failed.
RECOVERY_TIMEOUT_S = 30.0
#: Trickle kept running this long after recovery, then everything must complete within DRAIN_TIMEOUT_S.
TAIL_S = 1.0
DRAIN_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class RecoveryTrial:
    """One freeze: how long it lasted, when work resumed, and what the tally was."""

    frozen_s: float
    recovery_s: float
    state_at_thaw: str | None
    enqueued: int
    completed_unique: int
    duplicates: int
    lost: int
    worker_exit_code: int


@dataclass(frozen=True)
class RecoveryResult:
    trials: list[RecoveryTrial]

    @property
    def max_s(self) -> float:
        return max(t.recovery_s for t in self.trials)

    @property
    def median_s(self) -> float:
        return statistics.median(t.recovery_s for t in self.trials)


class Trickle:
    """A thread that XADDs one task every TRICKLE_EVERY_S; an XADD sent into a frozen server waits for it."""

    def __init__(self, url: str, stream: str, max_tasks: int) -> None:
        # No hidden retries: a retried XADD after a timeout could enqueue a task twice.
        self._client = redis.Redis.from_url(url, socket_timeout=60, retry=Retry(NoBackoff(), 0))
        self._stream = stream
        self._max_tasks = max_tasks
        self._stop = threading.Event()
        self.ids: list[str] = []
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="bench-trickle", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        try:
            next_at = time.monotonic()
            for i in range(self._max_tasks):
                if self._stop.is_set():
                    return
                mid = self._client.xadd(self._stream, fields(i))  # type: ignore[arg-type]
                self.ids.append(mid.decode() if isinstance(mid, bytes) else str(mid))
                next_at = max(next_at + TRICKLE_EVERY_S, time.monotonic())
                self._stop.wait(max(0.0, next_at - time.monotonic()))
        except BaseException as exc:  # reported by the caller
            self.error = exc

    def stop(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(70)
        self._client.close()


def read_stamps(path: Path) -> list[tuple[float, str]]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            out.append((float(parts[0]), parts[1]))
    return out


def _wait_for(predicate: Callable[[], bool], timeout_s: float, poll_s: float = 0.005) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(poll_s)
    return False


def one_trial(server: RedisServer, stream: str, freeze_s: float) -> RecoveryTrial:
    log_dir = Path(tempfile.mkdtemp(prefix="plaita-bench-recovery-"))
    log = log_dir / "stamps.log"
    trickle = Trickle(server.url, stream, max_tasks=int((freeze_s + 120) / TRICKLE_EVERY_S))
    try:
        with WorkerProcess(
            server.url,
            stream=stream,
            group="bench-recovery",
            handler="bench.handlers:stamp",
            env={"PLAITA_BENCH_LOG": str(log)},
        ) as worker:
            worker.wait_state("READING")
            trickle.start()
            if not _wait_for(lambda: len(read_stamps(log)) >= STEADY_STAMPS, 30):
                raise RuntimeError(f"worker not consuming the trickle: {worker.stderr_tail()}")
            server.freeze()
            t_freeze = time.monotonic()
            try:
                time.sleep(freeze_s)
            finally:
                server.thaw()
            t_thaw = time.monotonic()
            state_at_thaw = worker.state()
            if not _wait_for(lambda: any(t > t_thaw for t, _ in read_stamps(log)), RECOVERY_TIMEOUT_S):
                raise RuntimeError(f"no completion {RECOVERY_TIMEOUT_S} s after the thaw: {worker.stderr_tail()}")
            first_after = min(t for t, _ in read_stamps(log) if t > t_thaw)
            time.sleep(TAIL_S)
            trickle.stop()
            enqueued = set(trickle.ids)
            _wait_for(lambda: enqueued <= {m for _, m in read_stamps(log)}, DRAIN_TIMEOUT_S)  # else: lost > 0
            if trickle.error is not None:
                raise RuntimeError(f"trickle failed: {trickle.error!r}")
            exit_code = worker.terminate()
            seen = [m for _, m in read_stamps(log)]
            return RecoveryTrial(
                frozen_s=t_thaw - t_freeze,
                recovery_s=first_after - t_thaw,
                state_at_thaw=state_at_thaw,
                enqueued=len(enqueued),
                completed_unique=len(set(seen)),
                duplicates=len(seen) - len(set(seen)),
                lost=len(enqueued - set(seen)),
                worker_exit_code=exit_code,
            )
    finally:
        if server.frozen:
            server.thaw()
        trickle.stop()
        log.unlink(missing_ok=True)
        os.rmdir(log_dir)


def run(server: RedisServer, trials: int, freeze_s: float = 5.0) -> RecoveryResult:
    client = server.client()
    try:
        out = []
        for i in range(trials):
            stream = f"bench:recovery:{i}"
            client.delete(stream)
            try:
                out.append(one_trial(server, stream, freeze_s))
            finally:
                client.delete(stream, f"{stream}:dlq")
        return RecoveryResult(out)
    finally:
        client.close()
