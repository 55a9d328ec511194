"""``python -m bench``: every benchmark on private redis-servers, then docs/benchmarks.md and docs/img/*.png.

Sections: throughput (raw loop vs worker, 1/2/4 processes × concurrency 1/4/16) with idle CPU
and peak RSS, end-to-end latency, recovery after freeze / kill -9 + restart / proxy blackhole
and of a killed worker's 100 stranded tasks,
idle shutdown latency, restart storm and reclaim latency, and the chaos matrix.
``--quick`` is a ~2 minute smoke run with small counts (no matrix, docs not written).
"""

from __future__ import annotations

import argparse
import sys
import time

from bench import (
    flow_targets,
    flows,
    latency,
    parking,
    plots,
    recovery,
    report,
    shutdown,
    storm,
    stranded,
    throughput,
    worker_kill,
)
from bench import matrix as chaos
from bench.common import ROOT, exit_on_sigterm  # puts the repository root on sys.path first
from tests.support.redis_server import RedisServer

SECTIONS = ("throughput", "latency", "recovery", "workerkill", "shutdown", "storm", "flows", "matrix")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="smoke run (~2 min): small counts, no matrix, no docs")
    p.add_argument("--tasks", type=int, help="tasks per throughput run (default 20000; quick 2000)")
    p.add_argument(
        "--repeats", type=int, help="throughput rounds; each configuration keeps its median (default 3; quick 1)"
    )
    p.add_argument("--recovery-trials", type=int, help="trials per fault kind (default 20; quick 2)")
    p.add_argument("--shutdown-trials", type=int, help="idle SIGTERM trials (default 50; quick 5)")
    p.add_argument("--idle-s", type=float, help="seconds of idle CPU measurement (default 60; quick 5)")
    p.add_argument("--fault-s", type=float, default=5.0, help="seconds each recovery/matrix fault lasts (default 5)")
    p.add_argument("--latency-rate", type=float, default=200.0, help="offered tasks/s for latency (default 200)")
    p.add_argument("--latency-s", type=float, help="seconds of offered load for latency (default 10; quick 3)")
    p.add_argument("--storm-s", type=float, help="seconds B runs alongside A in the storm (default 10; quick 5)")
    p.add_argument(
        "--reclaim-trials", type=int, help="kill -9 reclaim trials; worker kill -9 trials per name (default 3; quick 1)"
    )
    p.add_argument(
        "--matrix",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run the chaos matrix too (default: yes; quick: no, the last matrix file is quoted)",
    )
    p.add_argument("--only", default="", help=f"comma-separated subset of {','.join(SECTIONS)} (docs not written)")
    p.add_argument(
        "--write",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="write docs/benchmarks.md and docs/img/ (default: yes for full runs of every section)",
    )
    a = p.parse_args(argv)
    q = a.quick
    a.tasks = a.tasks or (2000 if q else 20_000)
    a.repeats = a.repeats or (1 if q else 3)
    a.recovery_trials = a.recovery_trials or (2 if q else 20)
    a.shutdown_trials = a.shutdown_trials or (5 if q else 50)
    a.idle_s = a.idle_s if a.idle_s is not None else (5.0 if q else 60.0)
    a.latency_s = a.latency_s or (3.0 if q else 10.0)
    a.storm_s = a.storm_s or (5.0 if q else 10.0)
    a.reclaim_trials = a.reclaim_trials or (1 if q else 3)
    a.matrix = (not q) if a.matrix is None else a.matrix
    only = [s for s in a.only.split(",") if s]
    if any(s not in SECTIONS for s in only):
        p.error(f"--only takes {','.join(SECTIONS)}")
    a.sections = tuple(s for s in SECTIONS if (s in only if only else (s != "matrix" or a.matrix)))
    if a.write is None:
        a.write = not q and not only
    if a.tasks < 100 or a.recovery_trials < 1 or a.shutdown_trials < 1 or a.reclaim_trials < 1:
        p.error("--tasks >= 100 and every trial count >= 1 please")
    if not 0.5 <= a.fault_s <= 60 or a.idle_s < 0 or a.latency_s < 1 or a.storm_s < 1 or a.latency_rate <= 0:
        p.error("--fault-s within 0.5..60, --idle-s >= 0, --latency-s >= 1, --storm-s >= 1, --latency-rate > 0")
    return a


def command_line(argv: list[str]) -> str:
    return " ".join([".venv/bin/python -m bench", *argv])


def make_plots(res: report.Results) -> None:
    report.IMG.mkdir(parents=True, exist_ok=True)
    if res.throughput is not None:
        plots.throughput(res.throughput, report.IMG / "throughput.png")
        res.images["throughput"] = "img/throughput.png"
    if res.latency is not None:
        plots.latency(res.latency, report.IMG / "latency.png")
        res.images["latency"] = "img/latency.png"
    if res.recovery is not None:
        plots.recovery_timeline(res.recovery, report.IMG / "recovery-timeline.png")
        plots.recovery_times(res.recovery, report.IMG / "recovery-times.png", report.TARGET_RECOVERY_P95_S)
        res.images["timeline"] = "img/recovery-timeline.png"
        res.images["recovery"] = "img/recovery-times.png"
    if res.shutdown is not None:
        plots.shutdown(res.shutdown, report.IMG / "shutdown.png", report.TARGET_SHUTDOWN_S)
        res.images["shutdown"] = "img/shutdown.png"


def main(argv: list[str] | None = None) -> int:
    raw_argv = list(sys.argv[1:] if argv is None else argv)
    exit_on_sigterm()
    a = parse_args(raw_argv)
    started = time.monotonic()
    info = report.machine()
    print(f"plaita bench: {', '.join(a.sections)} · nproc {info['nproc']} · commit {info['commit']}", flush=True)
    res = report.Results()
    with RedisServer(persist=False) as server:
        assert server.proc is not None
        if "throughput" in a.sections:
            res.throughput = throughput.run(server.url, server.proc.pid, a.tasks, a.idle_s, a.repeats)
        if "latency" in a.sections:
            res.latency = latency.run(server.url, a.latency_rate, a.latency_s)
        if "shutdown" in a.sections:
            res.shutdown = shutdown.run(server.url, a.shutdown_trials)
            res.shutdown_frozen = shutdown.run_frozen(server, a.shutdown_trials)
        if "storm" in a.sections:
            res.storm = storm.storm(server.url, a.storm_s)
            res.reclaim = storm.reclaim(server.url, a.reclaim_trials)
        flows_section = ""
        if "recovery" in a.sections:  # a dead worker's stranded tasks, on the shared server
            flows_section += stranded.render(stranded.run(server.url, a.reclaim_trials)) + "\n"
        if "workerkill" in a.sections:
            flows_section += worker_kill.render(worker_kill.run(server.url, a.reclaim_trials)) + "\n"
        if "flows" in a.sections:
            flows_section += flows.render(flows.run(server.url, min(a.tasks, 5000), a.reclaim_trials))
            flows_section += "\n" + parking.render(parking.run(server.url))
            res.flow_cpu = flow_targets.run(server.url, 500 if a.quick else 4000, a.repeats)
    if "recovery" in a.sections:
        res.recovery = recovery.run(a.recovery_trials, a.fault_s)  # servers of its own (one is killed)
    matrix_s = 0.0
    if "matrix" in a.sections:
        t0 = time.monotonic()
        res.matrix = chaos.run(a.fault_s)
        matrix_s = time.monotonic() - t0
    wall_s = time.monotonic() - started
    if a.write:
        make_plots(res)
        if res.matrix is not None:
            chaos.write_doc(chaos.render(res.matrix), a.fault_s, matrix_s, info["commit"])
    section = report.Renderer(res, info, command_line(raw_argv), wall_s).render() + flows_section
    print()
    print(section)
    if a.write:
        report.write_docs(section)
        print(f"wrote {report.DOCS.relative_to(ROOT)} and {report.IMG.relative_to(ROOT)}/*.png")
    print(f"plaita bench: done in {wall_s / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
