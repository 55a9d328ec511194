"""A worker killed with kill -9 while holding many tasks: how soon a live worker runs them all.

Worker A (``--concurrency 100``, defaults otherwise) starts STRANDED tasks, each with an
``execution_id`` (so leased), each sleeping until a wall time past the kill; worker B (every flag
at its default, ``--concurrency 4``) reads the same queue. A gets SIGKILL once all of them run.
In the "busy" case B is also draining a backlog of BACKLOG short tasks (10 ms each) through the
recovery, so its handler slots are rarely free when a reclaim pass runs.
Recovery: from the kill until B has started every stranded task. Its bound at the defaults is
max(lease TTL, claim idle) + 2 reclaim intervals: the tasks become claimable after the first
term, and one reclaim pass (the next one, within an interval) must take them all.
"""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import redis

from bench.common import HandlerLog, Progress, WorkerProcess, fields, median, recording_worker, wait_for
from plaita.config import DEFAULT_CLAIM_MIN_IDLE_MS, DEFAULT_LEASE_TTL_S, DEFAULT_RECLAIM_INTERVAL_S

STRANDED = 100
#: Short tasks B drains through the recovery in the busy case (about 15 s of work at concurrency 4).
BACKLOG = 6000
BACKLOG_SLEEP_S = 0.01
CASES = ("idle", "busy")
#: Each stranded task sleeps until this long after its enqueue: well past the kill, well before
#: the earliest reclaim (so B's run of it is quick).
HOLD_S = 9.0
RECOVERY_LIMIT_S = 90.0
STREAM = "bench:stranded"
GROUP = "bench-stranded"


@dataclass(frozen=True)
class StrandedResult:
    #: Recovery times (seconds) by case ("idle", "busy").
    recovery_s: dict[str, list[float]]
    stranded: int = STRANDED
    lease_ttl_s: float = DEFAULT_LEASE_TTL_S
    claim_min_idle_ms: int = DEFAULT_CLAIM_MIN_IDLE_MS
    reclaim_interval_s: float = DEFAULT_RECLAIM_INTERVAL_S

    @property
    def bound_s(self) -> float:
        return max(self.lease_ttl_s, self.claim_min_idle_ms / 1000) + 2 * self.reclaim_interval_s


def _fields(n: int, until_wall: float) -> dict[str, str]:
    params = {"n": n, "until_wall": until_wall}
    body = {"type": "start", "flow_id": "bench", "execution_id": f"bench-stranded-{n}", "params": params}
    return {"payload": json.dumps(body, separators=(",", ":")), "schema_version": "1"}


def _worker(url: str, name: str, log: HandlerLog, concurrency: int) -> WorkerProcess:
    return recording_worker(url, STREAM, GROUP, name, log, concurrency)


def trial(url: str, i: int, busy: bool) -> float:
    client = redis.Redis.from_url(url, socket_timeout=30)
    client.flushdb()
    log_dir = Path(tempfile.mkdtemp(prefix="plaita-bench-stranded-"))
    log = HandlerLog(log_dir / "handler.log")
    ns = set(range(STRANDED))
    try:
        with _worker(url, f"stranded-a-{i}", log, STRANDED) as a:
            a.wait_state("READING")
            until = time.time() + HOLD_S
            pipe = client.pipeline(transaction=True)
            for n in sorted(ns):
                pipe.xadd(STREAM, _fields(n, until))  # type: ignore[arg-type]
            pipe.execute()

            def a_runs_all() -> bool:
                log.poll()
                return ns <= {e.n for e in log.of("S") if e.pid == a.pid}

            if not wait_for(a_runs_all, 30, 0.01):
                raise RuntimeError(f"stranded: A never ran all {STRANDED} tasks")
            b = _worker(url, f"stranded-b-{i}", log, 4)  # the survivor, beside A until the kill
            b.wait_state("READING")
            if busy:
                pipe = client.pipeline(transaction=False)
                for n in range(STRANDED, STRANDED + BACKLOG):
                    pipe.xadd(STREAM, fields(n, sleep_s=BACKLOG_SLEEP_S))  # type: ignore[arg-type]
                pipe.execute()
            t_kill = time.monotonic()
            a.kill9()
        with b:

            def b_ran_all() -> bool:
                log.poll()
                return ns <= {e.n for e in log.of("S") if e.pid == b.pid}

            if not wait_for(b_ran_all, RECOVERY_LIMIT_S, 0.01):
                raise RuntimeError(f"stranded: B did not start all {STRANDED} within {RECOVERY_LIMIT_S} s")
            return max(e.mono for e in log.of("S") if e.pid == b.pid and e.n in ns) - t_kill
    finally:
        client.close()
        log.path.unlink(missing_ok=True)
        log_dir.rmdir()


def run(url: str, trials: int) -> StrandedResult:
    progress = Progress(f"{STRANDED} stranded tasks of a worker killed with -9, at the defaults", trials * len(CASES))
    out: dict[str, list[float]] = {case: [] for case in CASES}
    for i in range(trials):
        for case in CASES:
            out[case].append(trial(url, i, busy=case == "busy"))
            progress.step(note=f"{case} survivor: all run elsewhere after {out[case][-1]:.2f} s")
    result = StrandedResult(out)
    progress.finish(", ".join(f"{c}: max {max(out[c]):.2f} s" for c in CASES) + f" (bound {result.bound_s:g} s)")
    return result


def render(result: StrandedResult) -> str:
    """The markdown section for docs/benchmarks.md."""
    rows = []
    for case in CASES:
        rec = result.recovery_s[case]
        met = "met" if max(rec) <= result.bound_s else "NOT met"
        what = "idle" if case == "idle" else f"draining {BACKLOG} short tasks"
        rows.append(
            f"| {result.stranded} | {what} | {len(rec)} | {median(rec):.2f} s | {max(rec):.2f} s | "
            f"{result.bound_s:g} s | {met} |"
        )
    return "\n".join(
        [
            "## Recovery of a killed worker's stranded tasks",
            "",
            f"`python -m bench --only recovery`: worker A (`--concurrency {result.stranded}`) runs "
            f"{result.stranded} leased tasks; worker B runs beside it at every default (`--concurrency 4 "
            f"--lease-ttl-s {result.lease_ttl_s:g} --claim-min-idle-ms {result.claim_min_idle_ms} "
            f"--reclaim-interval-s {result.reclaim_interval_s:g}`), idle or draining a backlog; A gets SIGKILL. "
            "Recovery: kill → B has started every one of A's tasks.",
            "",
            "| stranded tasks | survivor | trials | recovery median | recovery max | bound: max(TTL, idle) + 2 "
            "intervals | |",
            "|---|---|---|---|---|---|---|",
            *rows,
            "",
        ]
    )


if __name__ == "__main__":
    import sys

    from tests.support.redis_server import RedisServer

    with RedisServer(persist=False) as server:
        print(render(run(server.url, int(sys.argv[1]) if len(sys.argv) > 1 else 1)))
