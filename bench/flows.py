"""Flow executions on one worker process: executions/s and steps/s beside plain leased tasks
in the same run, Redis commands per step (``INFO commandstats``), and the recovery time of
an execution after a worker kill -9 with ``--lease-ttl-seconds 5``. The curve over
``--concurrency`` 1..64, sync and ``async def`` steps, with and without ``appendfsync always``,
against a baseline checkout, with true round trips per step: ``python -m bench.flowcurve``."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import redis

from bench.common import WorkerProcess, client_for, enqueue, median, wait_for

FLOW_STEPS = 3
#: Commands Redis counts when the checkpoint, create and lease scripts run them (not round trips).
SCRIPT_INNER = {"get", "set", "type", "zadd", "zrem", "exists", "expire", "incr", "incrby", "rpush", "del", "pexpire",
                "zremrangebyscore"}  # fmt: skip


@dataclass
class FlowBench:
    tasks: int
    plain_tasks_per_s: float
    executions_per_s: float
    executions_per_s_c4: float
    steps_per_s: float
    commands: dict[str, int]
    round_trips_per_step: float
    evalsha_per_step: float
    plain_round_trips_per_task: float
    recovery_s: list[float] = field(default_factory=list)


def _commandstats(client: redis.Redis) -> dict[str, int]:
    stats = client.info("commandstats")
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}


#: Sent by this benchmark itself (enqueue, polling), not by the worker.
BENCH_SIDE = {"info", "config|resetstat", "zcard", "xlen", "xadd", "multi", "exec"}


def _worker_side(stats: dict[str, int]) -> dict[str, int]:
    """Commands the worker sent (MULTI/EXEC are the bench's enqueue and the worker's acks:
    both dropped, the XACK inside each ack transaction still counts)."""
    return {k: v for k, v in stats.items() if k not in SCRIPT_INNER and k not in BENCH_SIDE and v}


def _top_level(stats: dict[str, int]) -> int:
    return sum(_worker_side(stats).values())


def _timed_drain(client: redis.Redis, worker: WorkerProcess, fill: Any, done: Any, timeout_s: float) -> float:
    """Reset the stats once the worker is reading, then enqueue every task in one MULTI/EXEC
    (the worker sees all of them at once) and time until ``done``."""
    worker.wait_state("READING")
    client.config_resetstat()
    started = time.monotonic()
    fill()
    if not wait_for(done, timeout_s, poll_s=0.01):
        raise RuntimeError(f"bench flows: not done within {timeout_s} s: {worker.stderr_tail()}")
    return time.monotonic() - started


def _plain(url: str, client: redis.Redis, stream: str, n: int) -> tuple[float, dict[str, int]]:
    client.delete(stream)
    client.xgroup_create(stream, "plaita-workers", id="0", mkstream=True)
    with WorkerProcess(url, stream=stream, group="plaita-workers", extra_args=["--no-registry"]) as w:
        fill = lambda: enqueue(client, stream, n, atomic=True, execution_ids=True)  # noqa: E731
        elapsed = _timed_drain(client, w, fill, lambda: client.xlen(stream) == 0, 300)
        stats = _commandstats(client)
    return n / elapsed, stats


def _flows(url: str, client: redis.Redis, stream: str, n: int, concurrency: int = 1) -> tuple[float, dict[str, int]]:
    client.delete(stream)
    client.xgroup_create(stream, "plaita-workers", id="0", mkstream=True)

    def fill() -> None:
        pipe = client.pipeline(transaction=True)
        for i in range(n):
            body = {"type": "start", "flow_id": "bench-noop3", "execution_id": f"bf-{i}", "params": {}}
            pipe.xadd(stream, {"payload": json.dumps(body), "schema_version": "1"})
        pipe.execute()

    args = ["--no-registry", "--flows", "bench.flowdefs", "--concurrency", str(concurrency)]
    with WorkerProcess(url, stream=stream, group="plaita-workers", extra_args=args) as w:
        done = lambda: int(client.zcard("plaita:executions:status:completed")) >= n  # noqa: E731
        elapsed = _timed_drain(client, w, fill, done, 300)
        stats = _commandstats(client)
    return n / elapsed, stats


def _recovery(url: str, client: redis.Redis, stream: str, trials: int) -> list[float]:
    """Two workers; kill -9 the one running the hanging step; time until the execution completes."""
    args = ["--no-registry", "--flows", "bench.flowdefs", "--lease-ttl-seconds", "5", "--claim-min-idle-ms", "1000",
            "--reclaim-interval-s", "1", "--read-block-ms", "200"]  # fmt: skip
    env = {"PLAITA_BENCH_REDIS_URL": url}
    out: list[float] = []
    for _ in range(trials):
        workers = [WorkerProcess(url, stream=stream, group="plaita-workers", extra_args=args, env=env) for _ in "ab"]
        try:
            for w in workers:
                w.wait_state("READING")
            out.append(_one_recovery(client, stream, workers))
        finally:
            for w in workers:
                w.close()
    return out


def _one_recovery(client: redis.Redis, stream: str, workers: list[WorkerProcess]) -> float:
    eid = f"slow-{uuid.uuid4().hex[:8]}"
    body = {"type": "start", "flow_id": "bench-slow", "execution_id": eid, "params": {}}
    client.xadd(stream, {"payload": json.dumps(body), "schema_version": "1"})
    if not wait_for(lambda: client.get(f"bench:flows:hanging:{eid}") is not None, 30):
        raise RuntimeError("bench flows: the hanging step never started")
    pid = int(client.get(f"bench:flows:hanging:{eid}"))  # type: ignore[arg-type]
    victim = next(w for w in workers if w.pid == pid)
    killed_at = time.monotonic()
    victim.kill9()
    if not wait_for(lambda: client.zscore("plaita:executions:status:completed", eid) is not None, 60, poll_s=0.01):
        raise RuntimeError("bench flows: the execution did not recover within 60 s")
    return time.monotonic() - killed_at


def run(url: str, tasks: int, trials: int) -> FlowBench:
    client = client_for(url)
    try:
        client.flushall()
        plain_rate, plain_stats = _plain(url, client, "bench:flows:plain", tasks)
        client.flushall()
        flow_rate, flow_stats = _flows(url, client, "bench:flows:queue", tasks)
        client.flushall()
        flow_rate_c4, _ = _flows(url, client, "bench:flows:queue", tasks, concurrency=4)
        steps = tasks * FLOW_STEPS
        client.flushall()
        recovery = _recovery(url, client, "bench:flows:recovery", trials)
    finally:
        client.close()
    return FlowBench(
        tasks=tasks,
        plain_tasks_per_s=plain_rate,
        executions_per_s=flow_rate,
        steps_per_s=flow_rate * FLOW_STEPS,
        executions_per_s_c4=flow_rate_c4,
        commands=dict(sorted(_worker_side(flow_stats).items(), key=lambda kv: -kv[1])),
        round_trips_per_step=_top_level(flow_stats) / steps,
        evalsha_per_step=flow_stats.get("evalsha", 0) / steps,
        plain_round_trips_per_task=_top_level(plain_stats) / tasks,
        recovery_s=recovery,
    )


def render(r: FlowBench) -> str:
    lines = [
        "",
        "## Flow executions",
        "",
        f"One worker process (`--flows bench.flowdefs`, concurrency 1), {r.tasks} tasks each, same server, same run.",
        "",
        "| workload | per second | Redis commands sent |",
        "|---|---|---|",
        f"| plain leased tasks (noop handler) | {r.plain_tasks_per_s:,.0f} tasks/s | "
        f"{r.plain_round_trips_per_task:.2f} per task |",
        f"| 3-step no-op flow | {r.executions_per_s:,.0f} executions/s = {r.steps_per_s:,.0f} steps/s | "
        f"{r.round_trips_per_step:.2f} per step ({r.evalsha_per_step:.2f} EVALSHA per step) |",
        f"| 3-step no-op flow, `--concurrency 4` | {r.executions_per_s_c4:,.0f} executions/s = "
        f"{r.executions_per_s_c4 * FLOW_STEPS:,.0f} steps/s | |",
        "",
        "Per start: one create call (Lua; it also returns an existing execution's state and the cancel flag), one "
        "checkpoint (Lua) per step; the lease acquire, the read and the ack (with the lease release) are batched per "
        "read. A resume reads its state with one MGET. Commands counted by `INFO commandstats` during the "
        "concurrency-1 flow run (commands run inside scripts excluded): "
        + ", ".join(f"{k} {v}" for k, v in r.commands.items())
        + ". Per step, beyond its checkpoint, nothing.",
        "",
    ]
    if r.recovery_s:
        lines.append(
            f"Recovery after kill -9 of the worker running step 2 (`--lease-ttl-seconds 5`, a second worker waiting): "
            f"median {median(r.recovery_s):.2f} s, max {max(r.recovery_s):.2f} s over {len(r.recovery_s)} trial(s) "
            "(lease expiry + reclaim interval + the rest of the execution)."
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    import sys

    from tests.support.redis_server import RedisServer

    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    with RedisServer(persist=False) as server:
        print(render(run(server.url, n, 2)))
