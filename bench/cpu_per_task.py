"""``python -m bench.cpu_per_task``: CPU per plain task of a worker against the raw loop, trees A/B.

On a shared machine wall-clock rates swing with the load; CPU time per task does not (much). Each
run starts one consumer on an empty stream of a private redis-server, reads utime+stime of it and
of redis-server from /proc, enqueues ``--tasks`` no-op tasks in one MULTI/EXEC, waits until the
stream is drained, and reads them again. A round runs the raw loop (``bench.rawloop``) and then
each concurrency on each tree (``--tree``, e.g. ``main`` exported with ``git archive``), so a
tree's ratio to the raw loop is taken within one round. ``--spy DIR`` records each worker run with
``py-spy record --gil`` (speedscope files in DIR). ``--callgrind DIR`` runs each worker under
``valgrind --tool=callgrind`` with counting switched on only for the drain, and reports
instructions per task instead: the same within ~0.5 % from run to run, whatever the load.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import redis

from bench.common import (
    ROOT,
    Subprocess,
    WorkerProcess,
    cpu_seconds,
    enqueue,
    group_pending,
    wait_for,
)
from tests.support.redis_server import RedisServer

GROUP = "cpu-bench"
#: How often the drain is sampled (XLEN + XINFO GROUPS: a few µs of server CPU each).
POLL_S = 0.02
#: Commands whose calls per task are shown.
COUNTED = ("xreadgroup", "exec", "xack", "evalsha")


def _sys_seconds(pid: int) -> float:
    """stime alone (kernel time: syscalls, wake-ups) of ``pid``."""
    text = Path(f"/proc/{pid}/stat").read_text()
    return int(text[text.rindex(")") + 2 :].split()[12]) / os.sysconf("SC_CLK_TCK")


def _switches(pid: int) -> int:
    """Context switches of every thread of ``pid`` so far (voluntary: a wait, a lock, the GIL)."""
    total = 0
    for status in Path(f"/proc/{pid}/task").glob("*/status"):
        try:
            lines = status.read_text().splitlines()
        except OSError:
            continue  # a thread that just ended
        total += sum(int(ln.split()[1]) for ln in lines if ln.endswith("ctxt_switches") or "ctxt_switches:" in ln)
    return total


def _calls(client: redis.Redis) -> dict[str, int]:
    stats = client.info("commandstats")
    return {name: int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in COUNTED}


@dataclass(frozen=True)
class Run:
    label: str
    worker_us: float
    #: Of it, kernel time (stime).
    worker_sys_us: float
    redis_us: float
    tasks_per_s: float
    #: Calls per task of the commands that matter here (INFO commandstats).
    calls: dict[str, float]


def _arrival(client: redis.Redis, stream: str) -> tuple[threading.Thread, list[float]]:
    """A thread noting when the stream first holds entries: the moment the enqueue's EXEC ran
    (all at once), well before the producer has parsed the replies (the consumer is at work then)."""
    seen: list[float] = []

    def watch() -> None:
        deadline = time.monotonic() + 600
        while not seen and time.monotonic() < deadline:
            if int(client.xlen(stream)) > 0:
                seen.append(time.monotonic())
                return
            time.sleep(0.001)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread, seen


def _drain(client: redis.Redis, stream: str, proc: Subprocess, timeout_s: float) -> float:
    """Wait until nothing is left in the stream or pending; when that was (monotonic)."""
    deadline = time.monotonic() + timeout_s
    while True:
        if not proc.alive():
            raise RuntimeError(f"consumer exited: {proc.stderr_tail()}")
        if int(client.xlen(stream)) == 0 and group_pending(client, stream, GROUP) == 0:
            return time.monotonic()
        if time.monotonic() > deadline:
            raise RuntimeError(f"not drained after {timeout_s} s: {proc.stderr_tail()}")
        time.sleep(POLL_S)


def _measure(
    client: redis.Redis,
    redis_pid: int,
    stream: str,
    total: int,
    proc: Subprocess,
    label: str,
    spy: Path | None,
    leased: bool = False,
) -> Run:
    spier = None
    if spy is not None:
        out = spy / f"{label.replace(' ', '_')}-{int(time.time())}.json"
        py_spy = str(Path(sys.executable).parent / "py-spy")
        args = [py_spy, "record", "--gil", "--rate", "2000", "--format", "speedscope", "-o", str(out)]
        spier = subprocess.Popen([*args, "--pid", str(proc.pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)  # attached before the tasks arrive
    calls0 = _calls(client)
    cpu0, rcpu0, sys0 = cpu_seconds(proc.pid), cpu_seconds(redis_pid), _sys_seconds(proc.pid)
    switches0 = _switches(proc.pid)
    watcher, arrived = _arrival(redis.Redis(connection_pool=client.connection_pool), stream)
    enqueue(client, stream, total, atomic=True, execution_ids=leased)
    watcher.join(60)
    seconds = _drain(client, stream, proc, timeout_s=600) - arrived[0]
    worker_us = (cpu_seconds(proc.pid) - cpu0) / total * 1e6
    redis_us = (cpu_seconds(redis_pid) - rcpu0) / total * 1e6
    sys_us = (_sys_seconds(proc.pid) - sys0) / total * 1e6
    calls = {k: (v - calls0[k]) / total for k, v in _calls(client).items()}
    calls["switches"] = (_switches(proc.pid) - switches0) / total
    calls["exec"] -= 1 / total  # the enqueue's
    if spier is not None:
        spier.send_signal(signal.SIGINT)
        spier.wait(60)
    return Run(label, worker_us, sys_us, redis_us, total / seconds, calls)


def raw_run(server: RedisServer, redis_pid: int, total: int, n: int) -> Run:
    client = server.client()
    stream = f"cpu-raw-{n}"
    client.xgroup_create(stream, GROUP, id="0", mkstream=True)
    with Subprocess([sys.executable, "-m", "bench.rawloop", server.url, stream, GROUP, "raw"]) as proc:
        if not wait_for(lambda: len(client.xinfo_consumers(stream, GROUP)) >= 1, 20):
            raise RuntimeError(f"raw loop not reading: {proc.stderr_tail()}")
        run = _measure(client, redis_pid, stream, total, proc, "raw", None)
        proc.terminate()
    client.delete(stream)
    return run


def _callgrind_total(path: Path) -> int:
    """The instructions (Ir) a callgrind output file counted."""
    totals = [int(line.split()[1]) for line in path.read_text().splitlines() if line.startswith("totals:")]
    if not totals:
        raise RuntimeError(f"no totals in {path}")
    return totals[-1]


def worker_run(
    server: RedisServer,
    redis_pid: int,
    total: int,
    n: int,
    tree: Path,
    concurrency: int,
    spy: Path | None,
    callgrind: Path | None = None,
    leased: bool = False,
) -> Run:
    client = server.client()
    stream = f"cpu-w-{n}"
    label = f"{tree.name} c{concurrency}{' leased' if leased else ''}"
    lease_args = ["--lease-format", "v2"] if leased else []
    out = None if callgrind is None else callgrind / f"{label.replace(' ', '_')}-{n}.out"
    prefix = None
    if out is not None:
        prefix = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"]
    with WorkerProcess(
        server.url,
        stream=stream,
        group=GROUP,
        extra_args=["--concurrency", str(concurrency), *lease_args],
        env={"PYTHONPATH": str(tree)},
        cwd=tree,
        prefix=prefix,
    ) as proc:
        proc.wait_state("READING", timeout_s=600 if out else 20)
        if out is not None:
            subprocess.run(["callgrind_control", "-i", "on", str(proc.pid)], check=True, capture_output=True)
        run = _measure(client, redis_pid, stream, total, proc, label, spy, leased)
        if out is not None:
            subprocess.run(["callgrind_control", "-i", "off", str(proc.pid)], check=True, capture_output=True)
        code = proc.terminate(timeout_s=120)
        if code != 0:
            raise RuntimeError(f"{label}: worker exited {code}: {proc.stderr_tail()}")
    client.delete(stream)
    if out is not None:
        run = Run(label, _callgrind_total(out) / total, 0.0, 0.0, 0.0, run.calls)
    return run


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cpu_per_task", description=__doc__)
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--tree", type=Path, action="append", help="a source tree to run (repeatable); default .")
    parser.add_argument("--no-raw", action="store_true", help="skip the raw loop")
    parser.add_argument(
        "--leased", action="store_true", help="also run leased tasks (an execution_id each, --lease-format v2)"
    )
    parser.add_argument("--spy", type=Path, help="record each worker run with py-spy into this folder")
    parser.add_argument(
        "--callgrind", type=Path, help="count each worker's instructions per task with callgrind (files in this folder)"
    )
    args = parser.parse_args(argv)
    trees = [t.resolve() for t in (args.tree or [ROOT])]
    for folder in (args.spy, args.callgrind):
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True)
    results: dict[str, list[Run]] = {}
    with RedisServer(persist=False) as server:
        for r in range(args.rounds):
            runs = _round(server, args, trees, r)
            for run in runs:
                _print(r, run, None if args.no_raw or args.callgrind else runs[0])
                results.setdefault(run.label, []).append(run)
    print("median over rounds:")
    for label, rs in results.items():
        print(
            f"  {label:<22} worker {statistics.median(r.worker_us for r in rs):8.1f}"
            f"  redis {statistics.median(r.redis_us for r in rs):5.1f} (µs or instructions per task)"
        )
    return 0


_runs = iter(range(1, 1 << 30))  # a fresh stream name for every run


def _round(server: RedisServer, args: argparse.Namespace, trees: list[Path], r: int) -> list[Run]:
    """The raw loop (unless ``--no-raw``), then each concurrency on each tree, in alternating order."""
    assert server.proc is not None
    pid = server.proc.pid
    if args.callgrind is not None:
        return [
            worker_run(server, pid, args.tasks, next(_runs), tree, conc, None, args.callgrind, leased)
            for conc in args.concurrency
            for tree in trees
            for leased in _kinds(args)
        ]
    runs = [] if args.no_raw else [raw_run(server, pid, args.tasks, next(_runs))]
    for conc in args.concurrency:
        # Alternate the order of the trees between rounds: neither always runs first.
        for tree in trees if r % 2 == 0 else trees[::-1]:
            for leased in _kinds(args):
                runs.append(worker_run(server, pid, args.tasks, next(_runs), tree, conc, args.spy, None, leased))
    return runs


def _kinds(args: argparse.Namespace) -> tuple[bool, ...]:
    """Plain tasks, and leased ones too with ``--leased``."""
    return (False, True) if args.leased else (False,)


def _print(r: int, run: Run, raw: Run | None) -> None:
    if run.tasks_per_s == 0.0:  # under callgrind: instructions only
        print(f"round {r + 1} {run.label:<22} {run.worker_us:8.0f} instructions/task", flush=True)
        return
    ratio = f"{run.tasks_per_s / raw.tasks_per_s:5.2f}" if raw else "  -  "
    cpu_ratio = f"{run.worker_us / raw.worker_us:4.2f}" if raw else " -  "
    calls = " ".join(f"{k} {v:.4f}" for k, v in run.calls.items() if v)
    print(
        f"round {r + 1} {run.label:<22} worker {run.worker_us:5.1f} µs/task (sys {run.worker_sys_us:4.1f}, "
        f"x{cpu_ratio} raw's)  redis {run.redis_us:5.1f} µs/task  {run.tasks_per_s:7.0f} tasks/s  ratio {ratio}"
        f"  (load {os.getloadavg()[0]:.1f})  per task: {calls}",
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
