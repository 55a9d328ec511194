"""``python -m bench.flowcurve``: a 3-step no-op flow on one worker process over ``--concurrency``
1..64, sync and ``async def`` steps, with and without ``appendfsync always``: executions/s,
EVALSHA per step (``INFO commandstats``), commands per step (commands run inside scripts left
out, as in ``bench/flows.py``) and round trips per step (requests the worker's redis-py wrote to
a socket, a pipeline being one: ``bench.countrt``), and CPU µs per execution of the worker
(utime + stime from ``/proc``) and of redis-server (``INFO cpu``) over the drain.

``--baseline DIR``: a checkout of another plaita (``git worktree add /tmp/base <commit>``); each
point is measured for it and for this checkout side by side (alternating which runs first), so
a loaded machine slows both alike and their ratio is what to read.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import redis

from bench.common import ROOT, WorkerProcess, client_for, cpu_seconds, median, wait_for
from bench.countrt import read_round_trips
from bench.flows import _commandstats, _top_level
from tests.support.redis_server import RedisServer

STEPS = 3
#: ``inline``: sync steps with ``@flow.step(inline=True)`` (on threads in a tree from before it)
FLOW_IDS = {"sync": "bench-noop3", "async": "bench-noop3-async", "inline": "bench-noop3-inline"}
COMPLETED = "plaita:executions:status:completed"
#: After the last execution completes, time for its ack (counted) before the stats are read.
SETTLE_S = 0.3


@dataclass(frozen=True)
class Point:
    variant: str
    fsync: str
    steps: str
    concurrency: int
    executions_per_s: float
    evalsha_per_step: float
    commands_per_step: float
    round_trips_per_step: float
    worker_cpu_us_per_execution: float = 0.0
    redis_cpu_us_per_execution: float = 0.0


def _source_dir(baseline: Path) -> Path:
    """A directory whose ``plaita`` is the baseline's and whose ``bench`` is this checkout's (the
    same flows and round-trip counter for both)."""
    d = Path(tempfile.mkdtemp(prefix="plaita-flowcurve-base-"))
    (d / "plaita").symlink_to(baseline.resolve() / "plaita")
    (d / "bench").symlink_to(ROOT / "bench")
    (d / "tests").symlink_to(ROOT / "tests")
    return d


def _fill(client: redis.Redis, stream: str, flow_id: str, n: int) -> None:
    pipe = client.pipeline(transaction=True)
    for i in range(n):
        body = {"type": "start", "flow_id": flow_id, "execution_id": f"fc-{i}", "params": {}}
        pipe.xadd(stream, {"payload": json.dumps(body), "schema_version": "1"})
    pipe.execute()


def _redis_cpu_s(client: redis.Redis) -> float:
    cpu = client.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


Measured = tuple[float, float, float, float, float, float]


def measure(url: str, cwd: Path, flow_id: str, n: int, concurrency: int) -> Measured:
    """(executions/s, EVALSHA/step, commands/step, round trips/step, worker CPU µs/execution,
    redis-server CPU µs/execution) of ``n`` executions."""
    client = client_for(url)
    stream = "bench:flowcurve:queue"
    rt_file = Path(tempfile.mkdtemp(prefix="plaita-flowcurve-rt-")) / "count"
    env = {"PYTHONPATH": str(cwd), "PLAITA_BENCH_RT_FILE": str(rt_file)}
    args = ["--no-registry", "--flows", "bench.flowdefs", "--concurrency", str(concurrency)]
    try:
        client.flushall()
        client.xgroup_create(stream, "plaita-workers", id="0", mkstream=True)
        with WorkerProcess(
            url, stream=stream, group="plaita-workers", extra_args=args, env=env, wrapper="bench.countrt", cwd=cwd
        ) as w:
            w.wait_state("READING")
            time.sleep(0.1)  # the counter file is written every 20 ms
            client.config_resetstat()
            rt_before, started = read_round_trips(rt_file), time.monotonic()
            cpu_before = cpu_seconds(w.pid), _redis_cpu_s(client)
            _fill(client, stream, flow_id, n)
            if not wait_for(lambda: int(client.zcard(COMPLETED)) >= n, 300, poll_s=0.005):
                raise RuntimeError(f"bench flowcurve: not done within 300 s: {w.stderr_tail()}")
            elapsed = time.monotonic() - started
            cpu_after = cpu_seconds(w.pid), _redis_cpu_s(client)
            time.sleep(SETTLE_S)
            stats, rt_after = _commandstats(client), read_round_trips(rt_file)
    finally:
        client.close()
    steps = n * STEPS
    worker_us, redis_us = ((a - b) * 1e6 / n for a, b in zip(cpu_after, cpu_before, strict=True))
    per_step = stats.get("evalsha", 0) / steps, _top_level(stats) / steps, (rt_after - rt_before) / steps
    return n / elapsed, *per_step, worker_us, redis_us


def curve(args: argparse.Namespace) -> list[Point]:
    """Every point ``args.repeats`` times, baseline and this checkout alternating which runs
    first; each point keeps the median of its rates and of its per-step counts."""
    variants = [("after", ROOT)]
    if args.baseline:
        variants.insert(0, ("baseline", _source_dir(Path(args.baseline))))
    points: list[Point] = []
    for fsync in args.fsync:
        with RedisServer(persist=fsync == "always") as server:
            for i, c in enumerate(args.concurrency):
                for kind in args.steps:
                    runs: dict[str, list[Measured]] = {name: [] for name, _ in variants}
                    for r in range(args.repeats):
                        order = variants if (i + r) % 2 == 0 else variants[::-1]
                        for name, cwd in order:
                            runs[name].append(measure(server.url, cwd, FLOW_IDS[kind], args.executions, c))
                    for name, measured in runs.items():
                        p = Point(name, fsync, kind, c, *(median(list(col)) for col in zip(*measured, strict=True)))
                        print(json.dumps(p.__dict__), flush=True)
                        points.append(p)
    return points


def render(points: list[Point]) -> str:
    """A markdown table: one row per (fsync, steps, concurrency), baseline and after side by side."""
    by = {(p.variant, p.fsync, p.steps, p.concurrency): p for p in points}
    has_base = any(p.variant == "baseline" for p in points)
    head = "| appendfsync | steps | concurrency | executions/s | EVALSHA/step | commands/step | round trips/step |"
    head += " worker CPU µs/execution | redis CPU µs/execution |"
    if has_base:
        head += " baseline executions/s | baseline EVALSHA/step | baseline round trips/step |"
        head += " baseline worker CPU µs/execution | speed-up |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for p in points:
        if p.variant != "after":
            continue
        fsync = "always" if p.fsync == "always" else "no AOF"
        row = (
            f"| {fsync} | {p.steps} | {p.concurrency} | {p.executions_per_s:,.0f} | {p.evalsha_per_step:.2f} | "
            f"{p.commands_per_step:.2f} | {p.round_trips_per_step:.2f} | {p.worker_cpu_us_per_execution:,.0f} | "
            f"{p.redis_cpu_us_per_execution:,.0f} |"
        )
        b = by.get(("baseline", p.fsync, p.steps, p.concurrency))
        if b is not None:
            row += (
                f" {b.executions_per_s:,.0f} | {b.evalsha_per_step:.2f} | {b.round_trips_per_step:.2f} | "
                f"{b.worker_cpu_us_per_execution:,.0f} | {p.executions_per_s / b.executions_per_s:.2f}× |"
            )
        lines.append(row)
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.flowcurve", description=__doc__)
    p.add_argument("--baseline", help="a checkout of the plaita to compare with (its plaita/ is used)")
    p.add_argument("--executions", type=int, default=1000, help="executions per point (default 1000)")
    p.add_argument("--concurrency", default="1,2,4,8,16,32,64", help="comma-separated (default 1,2,4,8,16,32,64)")
    p.add_argument("--fsync", default="off,always", help="off, always or both (default off,always)")
    p.add_argument(
        "--steps", default="sync,async", help="sync, async, inline (on the loop), comma-separated (default sync,async)"
    )
    p.add_argument("--repeats", type=int, default=1, help="runs per point, median kept (default 1)")
    p.add_argument("--json", help="also write the points to this file")
    a = checked_run_args(p, p.parse_args(argv))
    a.fsync = a.fsync.split(",")
    if any(f not in ("off", "always") for f in a.fsync):
        p.error("--fsync takes off,always")
    return a


def checked_run_args(p: argparse.ArgumentParser, a: argparse.Namespace) -> argparse.Namespace:
    """The flags every side-by-side flow bench shares (``flowcurve``, ``vsdbos``), parsed and checked:
    ``--concurrency`` and ``--steps`` (comma-separated), ``--executions``, ``--repeats``,
    ``--baseline``. A bad one exits 2 with its message (``p.error``)."""
    try:
        a.concurrency = [int(c) for c in a.concurrency.split(",")]
    except ValueError:
        p.error("--concurrency takes comma-separated integers")
    a.steps = a.steps.split(",")
    if any(s not in FLOW_IDS for s in a.steps):
        p.error("--steps takes sync, async, inline (comma-separated)")
    if a.executions < 10 or a.repeats < 1 or any(c < 1 for c in a.concurrency):
        p.error("--executions >= 10, --repeats >= 1 and every concurrency >= 1 please")
    if a.baseline and not (Path(a.baseline) / "plaita").is_dir():
        p.error(f"--baseline {a.baseline}: no plaita/ there")
    return a


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    points = curve(args)
    if args.json:
        Path(args.json).write_text(json.dumps([p.__dict__ for p in points], indent=1))
    print(f"{args.executions} executions per run, median of {args.repeats} run(s) per point, one worker process.\n")
    print(render(points))


if __name__ == "__main__":
    main()
