"""A worker killed with kill -9 at the default settings: what runs again, and how soon its work runs elsewhere.

Worker A (``--concurrency 4``, defaults otherwise, ``bench.handlers:record``) gets a backlog of
BACKLOG short plain tasks and LONG long ones (half of them with an ``execution_id``, leased before
they start; half plain, leased lazily once they outlive a renewal interval) that sleep on their
first delivery only. Once the long ones run and A has finished at least KILL_AFTER short ones, A
gets SIGKILL and B starts, under A's consumer name (a systemd restart) or under another one (a
Deployment pod, a new host).

* re-runs: short tasks A finished (``E`` logged) that ran again; at most ``--concurrency`` +
  ``ACK_WINDOW`` by design (the settler's ack window).
* recovery: from the kill until B has started every long task A was running (B must wait for their
  leases to expire and their entries to go idle under another name; its own name resumes at once).
"""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import redis

from bench.common import HandlerLog, Progress, WorkerProcess, enqueue, median, recording_worker, wait_for
from plaita.config import DEFAULT_CLAIM_MIN_IDLE_MS, DEFAULT_LEASE_TTL_S, DEFAULT_RECLAIM_INTERVAL_S
from plaita.runtime.settler import ACK_WINDOW

CONCURRENCY = 4
BACKLOG = 20_000
#: Long tasks (one leased, one plain), fewer than CONCURRENCY so short ones run beside them.
LONG = 2
LONG_SLEEP_S = 60.0
#: Short tasks A must have finished before the kill (so its ack pipeline is in full swing).
KILL_AFTER = 3000
RECOVERY_LIMIT_S = 60.0
STREAM = "bench:worker-kill"
GROUP = "bench-worker-kill"
NAMES = ("same", "other")


@dataclass(frozen=True)
class KillTrial:
    name: str
    reruns: int
    finished_by_a: int
    recovery_s: float


@dataclass(frozen=True)
class KillResult:
    trials: list[KillTrial]
    concurrency: int = CONCURRENCY
    window: int = ACK_WINDOW
    lease_ttl_s: float = DEFAULT_LEASE_TTL_S
    claim_min_idle_ms: int = DEFAULT_CLAIM_MIN_IDLE_MS
    reclaim_interval_s: float = DEFAULT_RECLAIM_INTERVAL_S

    @property
    def bound(self) -> int:
        return self.concurrency + self.window

    def of(self, name: str) -> list[KillTrial]:
        return [t for t in self.trials if t.name == name]


def _long_fields(i: int, leased: bool, until_wall: float) -> dict[str, str]:
    """A long task: it runs until ``until_wall`` (past A's kill), so its rerun on the replacement,
    after A's lease expired, is quick. Not "sleep on the first delivery only": a killed worker's
    task is reclaimed as a suspect with its delivery count kept at 1 (``runtime/suspects.py``)."""
    params = {"n": i, "until_wall": until_wall}
    body: dict[str, object] = {"type": "start", "flow_id": "bench", "params": params}
    if leased:
        body["execution_id"] = f"bench-kill-{i}"
    return {"payload": json.dumps(body, separators=(",", ":")), "schema_version": "1"}


def _worker(url: str, name: str, log: HandlerLog) -> WorkerProcess:
    return recording_worker(url, STREAM, GROUP, name, log, CONCURRENCY)


def trial(url: str, replacement: str, i: int) -> KillTrial:
    client = redis.Redis.from_url(url, socket_timeout=30)
    client.flushdb()
    log_dir = Path(tempfile.mkdtemp(prefix="plaita-bench-kill-"))
    log = HandlerLog(log_dir / "handler.log")
    long_ns = set(range(BACKLOG, BACKLOG + LONG))
    try:
        a_name = f"kill-a-{i}"
        with _worker(url, a_name, log) as a:
            a.wait_state("READING")
            pipe = client.pipeline(transaction=True)
            until_wall = time.time() + min(LONG_SLEEP_S, DEFAULT_LEASE_TTL_S)
            for n in sorted(long_ns):
                pipe.xadd(STREAM, _long_fields(n, leased=n % 2 == 0, until_wall=until_wall))  # type: ignore[arg-type]
            pipe.execute()
            enqueue(client, STREAM, BACKLOG)

            def ready() -> bool:
                log.poll()
                started = {e.n for e in log.of("S") if e.pid == a.pid}
                done = sum(1 for e in log.of("E") if e.pid == a.pid)
                return long_ns <= started and done >= KILL_AFTER

            if not wait_for(ready, 60, 0.01):
                raise RuntimeError(f"worker-kill: A never ran its long tasks and {KILL_AFTER} short ones")
            t_kill = time.monotonic()
            a.kill9()
            a_pid = a.pid
        log.poll()
        finished_by_a = {e.n for e in log.of("E") if e.pid == a_pid}
        b_name = a_name if replacement == "same" else f"kill-b-{i}"
        with _worker(url, b_name, log) as b:

            def long_restarted() -> bool:
                log.poll()
                return long_ns <= {e.n for e in log.of("S") if e.pid == b.pid}

            if not wait_for(long_restarted, RECOVERY_LIMIT_S, 0.01):
                raise RuntimeError(f"worker-kill: B did not restart A's long tasks within {RECOVERY_LIMIT_S} s")
            recovered = max(e.mono for e in log.of("S") if e.pid == b.pid and e.n in long_ns)
            if not wait_for(lambda: log.all_finished(set(range(BACKLOG))), 120, 0.05):
                raise RuntimeError("worker-kill: B did not finish the backlog")
            b.terminate()
        reruns = len({e.n for e in log.of("S") if e.pid != a_pid and e.n in finished_by_a})
        return KillTrial(replacement, reruns, len(finished_by_a), recovered - t_kill)
    finally:
        client.close()
        log.path.unlink(missing_ok=True)
        log_dir.rmdir()


def run(url: str, trials: int) -> KillResult:
    progress = Progress("worker kill -9 at the defaults (replacement: same name, other name)", trials * len(NAMES))
    out = []
    for i in range(trials):
        for name in NAMES:
            t = trial(url, name, i)
            out.append(t)
            progress.step(note=f"{name}: {t.reruns} re-runs, work elsewhere after {t.recovery_s:.2f} s")
    result = KillResult(out)
    summary = [
        f"{n}: max {max(t.recovery_s for t in result.of(n)):.2f} s, re-runs max {max(t.reruns for t in result.of(n))}"
        for n in NAMES
    ]
    progress.finish(", ".join(summary) + f" (bound {result.bound})")
    return result


def render(result: KillResult) -> str:
    """The markdown section for docs/benchmarks.md."""
    rows = []
    for name in NAMES:
        ts = result.of(name)
        title = "same consumer name (a restart)" if name == "same" else "another consumer name (a new pod or host)"
        rec = [t.recovery_s for t in ts]
        rows.append(
            f"| {title} | {len(ts)} | {median(rec):.2f} s | {max(rec):.2f} s | "
            f"{', '.join(str(t.reruns) for t in ts)} | {result.bound} |"
        )
    return "\n".join(
        [
            "## Worker kill -9 at the defaults",
            "",
            f"`python -m bench --only workerkill`: worker A (`--concurrency {result.concurrency}`, every other flag at "
            f"its default: `--lease-ttl-s {result.lease_ttl_s:g} --claim-min-idle-ms {result.claim_min_idle_ms} "
            f"--reclaim-interval-s {result.reclaim_interval_s:g}`) drains {BACKLOG} short plain tasks while {LONG} "
            f"long ones run (one with an `execution_id`, one plain); after {KILL_AFTER} short ones A gets SIGKILL "
            "and B starts. Recovery: kill → B has started every long task A was running. Re-runs: short tasks A had "
            f"finished that ran again; the bound is `--concurrency` + the ack window ({result.window}).",
            "",
            "| replacement | trials | recovery median | recovery max | re-runs per trial | re-run bound |",
            "|---|---|---|---|---|---|",
            *rows,
            "",
        ]
    )
