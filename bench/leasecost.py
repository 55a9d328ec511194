"""``python -m bench.leasecost``: what a leased task costs, against the raw loop and plain tasks.

One worker process, no-op handler, configurations ``raw`` (``bench/rawloop.py``), ``c1``/``c4``
(plain bodies at ``--concurrency`` 1/4), ``c1e``/``c4e`` (bodies with an ``execution_id``:
leased before they run, lease format v1) and ``c1e2``/``c4e2`` (the same, ``--lease-format v2``).
Per run: tasks/s and its ratio to the raw loop run just before, CPU per task (utime+stime) of the
worker and of redis-server, Redis commands per task from ``INFO commandstats`` (every command, those
run inside scripts included, since ``CONFIG RESETSTAT`` just before the enqueue) and the worker's
round trips per task (``bench.countrt``).
``--scripts-only``: redis-server CPU of the acquire and release scripts alone, per execution, in
each lease format (from /proc and from ``INFO commandstats``).

``--baseline DIR``: a checkout of another plaita; each round runs, per configuration, the raw
loop and then that configuration for it and for this checkout (alternating which goes first), so
both see the same machine load and the per-round ratios are what to compare.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import redis

from bench.common import (
    ROOT,
    Subprocess,
    WorkerProcess,
    cpu_seconds,
    enqueue,
    scan_calls,
    start_all,
    wait_fleet_checked,
    wait_for,
)
from bench.countrt import read_round_trips
from bench.flowcurve import _source_dir
from bench.throughput import GROUP, _drain
from plaita.store import scripts
from plaita.store.keyspace import DEFAULT
from plaita.store.leases import FENCE_TTL_S
from tests.support.redis_server import RedisServer

#: config -> (concurrency, bodies with an execution_id, lease format)
CONFIGS = {
    "raw": (0, False, "v1"),
    "c1": (1, False, "v1"),
    "c4": (4, False, "v1"),
    "c1e": (1, True, "v1"),
    "c4e": (4, True, "v1"),
    "c1e2": (1, True, "v2"),
    "c4e2": (4, True, "v2"),
}
#: Sent by the bench itself (enqueue, drain polling, stats), not by the consumer.
BENCH_SIDE = {"info", "config|resetstat", "xlen", "xadd", "xinfo|groups", "xinfo|consumers", "flushdb"}


@dataclass
class Run:
    variant: str
    round_no: int
    config: str
    tasks_per_s: float
    worker_cpu_us: float
    redis_cpu_us: float
    #: command -> (calls per task, µs of redis-server time per task), bench-side commands left out.
    commands: dict[str, tuple[float, float]] = field(default_factory=dict)
    round_trips: float = 0.0
    ratio: float = 0.0

    @property
    def commands_per_task(self) -> float:
        return sum(calls for calls, _ in self.commands.values())


def _commandstats(client: redis.Redis, tasks: int) -> dict[str, tuple[float, float]]:
    stats = client.info("commandstats")
    out = {}
    for key, v in stats.items():
        name = key.removeprefix("cmdstat_")
        if name not in BENCH_SIDE and int(v["calls"]):
            out[name] = (int(v["calls"]) / tasks, int(v["usec"]) / tasks)
    return out


def _consumer(url: str, stream: str, cwd: Path, config: str, rt_file: Path) -> Subprocess:
    concurrency, _, lease_format = CONFIGS[config]
    env = {"PYTHONPATH": str(cwd), "PLAITA_BENCH_RT_FILE": str(rt_file)}
    if concurrency == 0:
        args = [sys.executable, "-m", "bench.countrt", "bench.rawloop", url, stream, GROUP, "raw-0"]
        return Subprocess(args, env=env, prefix="plaita-bench-raw-", cwd=cwd)
    return WorkerProcess(
        url, stream=stream, group=GROUP, consumer_name="bench-lease-0", env=env, wrapper="bench.countrt",
        extra_args=["--concurrency", str(concurrency), *(["--lease-format", "v2"] if lease_format == "v2" else [])],
        cwd=cwd,
    )  # fmt: skip


def measure(url: str, redis_pid: int, cwd: Path, config: str, tasks: int) -> Run:
    """One run of ``config`` with ``cwd``'s plaita on a flushed server."""
    client = redis.Redis.from_url(url, socket_timeout=30)
    stream = "bench:leasecost"
    rt_file = Path(tempfile.mkdtemp(prefix="plaita-leasecost-rt-")) / "count"
    client.flushdb()
    client.xgroup_create(stream, GROUP, id="0", mkstream=True)
    scans0 = scan_calls(client)
    proc = _consumer(url, stream, cwd, config, rt_file)
    try:
        if isinstance(proc, WorkerProcess):
            start_all([proc])
            wait_fleet_checked(client, 1, scans0)
        elif not wait_for(lambda: len(client.xinfo_consumers(stream, GROUP)) >= 1, 20):
            raise RuntimeError(f"raw loop not reading after 20 s: {proc.stderr_tail()}")
        time.sleep(0.05)  # the round-trip file is written every 20 ms
        client.config_resetstat()
        rt0, cpu0, rcpu0 = read_round_trips(rt_file), cpu_seconds(proc.pid), cpu_seconds(redis_pid)
        t_enq = time.monotonic()
        enqueue(client, stream, tasks, atomic=True, execution_ids=CONFIGS[config][1])
        _, rate = _drain(client, stream, tasks, [proc], config, 300.0, t_enq)
        cpu_us = (cpu_seconds(proc.pid) - cpu0) / tasks * 1e6
        rcpu_us = (cpu_seconds(redis_pid) - rcpu0) / tasks * 1e6
        commands = _commandstats(client, tasks)
        time.sleep(0.05)
        rt = (read_round_trips(rt_file) - rt0) / tasks
        proc.terminate()
    finally:
        proc.close()
        client.close()
    return Run("", 0, config, rate, cpu_us, rcpu_us, commands, rt)


def rounds(args: argparse.Namespace) -> list[Run]:
    """Per round and configuration: the raw loop, then each tree (alternating which goes first),
    so a configuration's before and after are measured next to each other and next to the raw
    loop their ratio is taken against."""
    variants = [("after", ROOT)]
    if args.baseline:
        variants.insert(0, ("before", _source_dir(Path(args.baseline))))
    runs: list[Run] = []
    with RedisServer(persist=False) as server:
        assert server.proc is not None

        def one(name: str, cwd: Path, config: str, round_no: int, raw_rate: float) -> Run:
            run = measure(server.url, server.proc.pid, cwd, config, args.tasks)  # type: ignore[union-attr]
            run.variant, run.round_no = name, round_no
            run.ratio = run.tasks_per_s / raw_rate if raw_rate else 1.0
            print(json.dumps(asdict(run)), flush=True)
            runs.append(run)
            return run

        for r in range(args.rounds):
            for i, config in enumerate(c for c in args.configs if c != "raw"):
                raw = one("raw", ROOT, "raw", r + 1, 0.0)
                for name, cwd in variants if (r + i) % 2 == 0 else variants[::-1]:
                    one(name, cwd, config, r + 1, raw.tasks_per_s)
    return runs


def _scripts_of(tree: Path) -> tuple[str, str]:
    """The acquire and release scripts of ``tree``'s plaita, as the server runs them."""
    lua = tree / "plaita" / "store" / "lua"
    names = ("acquire_leases-n.lua", "release_leases-n.lua")
    acquire, release = (scripts.assemble(n, (lua / n).read_text(), scripts.INCLUDES)[0] for n in names)
    return acquire, release


def script_cost(args: argparse.Namespace) -> None:
    """``--scripts-only``: redis-server CPU per execution of the two lease scripts alone, as the
    worker calls them (acquire per batch of 128 fresh executions, then release), per tree and
    lease format: from /proc (utime+stime) and from ``INFO commandstats`` (EVALSHA's usec, which
    counts the commands a script runs; neither counts time the server waited for the CPU)."""
    variants = {
        "v1": (ROOT, "1"),
        "v2": (ROOT, "2"),
        **({"before": (Path(args.baseline), "1")} if args.baseline else {}),
    }
    holder, batch = "worker:bench@0123456789ab", 128
    with RedisServer(persist=False) as server:
        assert server.proc is not None
        client, pid = redis.Redis.from_url(server.url), server.proc.pid
        shas = {name: [client.script_load(src) for src in _scripts_of(tree)] for name, (tree, _) in variants.items()}
        for r in range(args.rounds):
            for name in sorted(variants) if r % 2 == 0 else sorted(variants, reverse=True):
                (acquire, release), fmt = shas[name], variants[name][1]
                client.flushdb()
                held, cpu0, stats = [], cpu_seconds(pid), []
                client.config_resetstat()
                for lo in range(0, args.tasks, batch):
                    ids = [f"bench-exec-{i}" for i in range(lo, min(lo + batch, args.tasks))]
                    keys = [k for e in ids for k in (DEFAULT.lease_key(e), DEFAULT.fence_key(e))]
                    argv = [holder, 10_000, FENCE_TTL_S, "worker:bench@", fmt]
                    # The partition's generation counter (v2; v1 only reads it); the baseline has none.
                    counter = [DEFAULT.generation_key(0)] if name != "before" else []
                    reply = client.evalsha(acquire, len(keys) + len(counter), *keys, *counter, *argv)
                    # {1, gen, ...} pairs before the one-reply-per-execution format, one gen each since
                    gens = reply[1::2] if len(reply) == 2 * len(ids) else reply
                    held.append((keys[0::2], [f"{holder}:{g}" for g in gens]))
                cpu1 = cpu_seconds(pid)
                stats.append(_evalsha_usec(client))
                client.config_resetstat()
                for lease_keys, values in held:
                    client.evalsha(release, len(lease_keys), *lease_keys, *values)
                cpu2 = cpu_seconds(pid)
                stats.append(_evalsha_usec(client))
                us = [(b - a) / args.tasks * 1e6 for a, b in ((cpu0, cpu1), (cpu1, cpu2))]
                st = [u / args.tasks for u in stats]
                print(
                    f"round {r + 1} {name}: acquire {us[0]:.2f}, release {us[1]:.2f} µs per execution "
                    f"(commandstats: acquire {st[0]:.2f}, release {st[1]:.2f})",
                    flush=True,
                )
        client.close()


def _evalsha_usec(client: redis.Redis) -> int:
    return int(client.info("commandstats").get("cmdstat_evalsha", {}).get("usec", 0))


def render(runs: list[Run]) -> str:
    """Per configuration and variant, every round's numbers side by side; then the command mix."""
    head = (
        "| config | tree | tasks/s vs raw | worker CPU µs/task | redis-server CPU µs/task | commands/task "
        "| round trips/task |"
    )
    lines = [head, "|---|---|---|---|---|---|---|"]
    keys = list(dict.fromkeys((r.config, r.variant) for r in runs))
    for config, variant in sorted(keys, key=lambda k: (list(CONFIGS).index(k[0]), k[1] != "before")):
        rs = [r for r in runs if r.config == config and r.variant == variant]
        lines.append(
            f"| {config} | {variant} | {', '.join(f'{r.ratio:.2f}' for r in rs)} | "
            f"{', '.join(f'{r.worker_cpu_us:.1f}' for r in rs)} | {', '.join(f'{r.redis_cpu_us:.1f}' for r in rs)} | "
            f"{', '.join(f'{r.commands_per_task:.2f}' for r in rs)} | {', '.join(f'{r.round_trips:.3f}' for r in rs)} |"
        )
    lines += ["", "| config | tree | command | calls/task | redis µs/task |", "|---|---|---|---|---|"]
    for config, variant in keys:
        last = [r for r in runs if r.config == config and r.variant == variant][-1]
        for name, (calls, usec) in sorted(last.commands.items(), key=lambda kv: -kv[1][1]):
            lines.append(f"| {config} | {variant} | {name} | {calls:.3f} | {usec:.2f} |")
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.leasecost", description=__doc__)
    p.add_argument("--baseline", help="a checkout of the plaita to compare with (its plaita/ is used)")
    p.add_argument("--tasks", type=int, default=20_000, help="tasks per run (default 20000)")
    p.add_argument("--rounds", type=int, default=3, help="rounds (default 3)")
    p.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated of {','.join(CONFIGS)}")
    p.add_argument("--scripts-only", action="store_true", help="redis-server CPU of the lease scripts alone")
    a = p.parse_args(argv)
    a.configs = [c for c in a.configs.split(",") if c]
    if any(c not in CONFIGS for c in a.configs) or a.tasks < 100 or a.rounds < 1:
        p.error(f"--configs of {','.join(CONFIGS)}, --tasks >= 100, --rounds >= 1")
    if a.baseline and not (Path(a.baseline) / "plaita").is_dir():
        p.error(f"--baseline {a.baseline}: no plaita/ there")
    return a


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    if args.scripts_only:
        script_cost(args)
        return
    runs = rounds(args)
    print(f"\n{args.tasks} tasks per run, {args.rounds} rounds, one consumer process.\n")
    print(render(runs))


if __name__ == "__main__":
    main()
