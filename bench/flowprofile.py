"""``python -m bench.flowprofile``: where a flow worker's CPU goes, per step (issue 35: "profile
first and write the top costs per step before/after").

One worker process (``--flows bench.flowdefs``) runs ``--executions`` 3-step no-op executions
(``sync`` or ``async def`` steps) at ``--concurrency`` on a private redis-server, sampled by
``py-spy record --format raw`` (py-spy is pinned in the ``bench`` extra: a sampling profiler,
so the worker runs at its own speed, not under a tracer). The samples taken while the queue
drains are folded two ways and printed as µs of worker CPU per step (the samples' share of the
worker's measured CPU over the drain):

- **self**: the function on top of the stack (where the CPU is burnt);
- **area**: the outermost plaita module on the stack under the event loop or a thread's entry
  (what part of the house asked for it): runner, store adapter, runtime, redis-py, asyncio.

    python -m bench.flowprofile [--executions 4000] [--concurrency 64] [--steps async] [--top 25]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from bench.common import WorkerProcess, client_for, cpu_seconds, wait_for
from bench.flowcurve import COMPLETED, FLOW_IDS, STEPS, _fill
from tests.support.redis_server import RedisServer

#: Functions on top of a waiting thread's stack (in C: a queue get, a condition, select, a recv
#: for a reply not there yet). py-spy --nonblocking cannot always tell a thread blocked in a
#: syscall from one running, and these waits are no CPU: left out of "busy".
IDLE = (
    *("select", "epoll", ":wait", "_wait_for_tstate_lock", ":acquire", ":get", "thread.py:_worker"),
    *("Condition.wait", "read_from_socket"),
)
_PLAITA_FILE = re.compile(r"[( /]plaita/([\w/]+)\.py:")
#: py-spy samples per second: enough samples for a 2–5 s drain without slowing the worker much.
RATE_HZ = 1000


def _frames(stack: str) -> list[str]:
    """A raw py-spy stack ``f (file:line);g (file:line)`` as its frames, outermost first."""
    return [f for f in stack.split(";") if f]


def _where(frame: str) -> str:
    """``func (path/to/file.py:12)`` as ``file.py:func`` with the path made short."""
    name, _, rest = frame.partition(" (")
    path = rest.rsplit(":", 1)[0]
    for marker in ("/plaita/", "/site-packages/", "/lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{path}:{name}"


def _area(frames: list[str]) -> str:
    """The package of the innermost plaita frame (``flows/runner``, ``store/executions``, ...),
    else the library on top (redis, asyncio, threading, ...). py-spy names a file under the
    current directory by its relative path, others by their absolute one."""
    for frame in reversed(frames):
        m = _PLAITA_FILE.search(frame)
        if m is not None:
            return m.group(1).rsplit("/", 1)[0] if "/" in m.group(1) else "plaita"
    top = frames[-1] if frames else "?"
    return _where(top).split("/", 1)[0].split(".py", 1)[0]


def fold(raw: Path) -> tuple[Counter[str], Counter[str], int]:
    """(self samples by function, samples by area, all samples) of a raw py-spy file; idle
    samples (a thread waiting in select/epoll, a lock, a queue get) are left out."""
    by_self: Counter[str] = Counter()
    by_area: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = _frames(stack)
        if not frames or not count.isdigit():
            continue
        top = _where(frames[-1])
        if any(idle in top for idle in IDLE):
            continue
        n = int(count)
        by_self[top] += n
        by_area[_area(frames)] += n
        total += n
    return by_self, by_area, total


def profile(args: argparse.Namespace) -> dict[str, object]:
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    out = Path(tempfile.mkdtemp(prefix="plaita-flowprofile-")) / "raw.txt"
    stream = "bench:flowprofile:queue"
    with RedisServer() as server:
        client = client_for(server.url)
        client.xgroup_create(stream, "plaita-workers", id="0", mkstream=True)
        flags = ["--no-registry", "--flows", "bench.flowdefs", "--concurrency", str(args.concurrency)]
        with WorkerProcess(server.url, stream=stream, group="plaita-workers", extra_args=flags) as w:
            w.wait_state("READING")
            # Attached once the worker reads, detached once the queue is drained: start-up and
            # shutdown are not in the samples. --nonblocking: the worker is never paused to sample.
            record = [spy, "record", "--nonblocking", "-r", str(RATE_HZ), "--format", "raw", "-o", str(out)]
            spying = subprocess.Popen([*record, "--pid", str(w.pid)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            time.sleep(1.0)  # py-spy attaches (no readiness signal to wait on; a bench, not a test)
            cpu_before, started = cpu_seconds(w.pid), time.monotonic()
            _fill(client, stream, FLOW_IDS[args.steps], args.executions)
            if not wait_for(lambda: int(client.zcard(COMPLETED)) >= args.executions, 300, poll_s=0.01):
                raise RuntimeError(f"bench flowprofile: not done within 300 s: {w.stderr_tail()}")
            elapsed_s, cpu_s = time.monotonic() - started, cpu_seconds(w.pid) - cpu_before
            spying.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
            spying.wait(30)
        client.close()
    by_self, by_area, total = fold(out)
    steps = args.executions * STEPS
    us_per_sample = cpu_s * 1e6 / steps / max(total, 1)
    return {
        "steps": args.steps,
        "concurrency": args.concurrency,
        "executions_per_s": round(args.executions / elapsed_s),
        "worker_cpu_us_per_step": round(cpu_s * 1e6 / steps, 1),
        "samples": total,
        "self_us_per_step": [(f, round(n * us_per_sample, 1)) for f, n in by_self.most_common(args.top)],
        "area_us_per_step": [(a, round(n * us_per_sample, 1)) for a, n in by_area.most_common()],
    }


def refold(args: argparse.Namespace) -> dict[str, object]:
    """The shares of an earlier run's samples (no CPU figure: µs are per 100 busy samples)."""
    by_self, by_area, total = fold(args.raw)
    scale = 100 / max(total, 1)
    return {
        "steps": args.steps,
        "concurrency": args.concurrency,
        "executions_per_s": 0,
        "worker_cpu_us_per_step": 0,
        "samples": total,
        "self_us_per_step": [(f, round(n * scale, 1)) for f, n in by_self.most_common(args.top)],
        "area_us_per_step": [(a, round(n * scale, 1)) for a, n in by_area.most_common()],
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.flowprofile", description=__doc__)
    p.add_argument("--executions", type=int, default=4000, help="executions to drain (default 4000)")
    p.add_argument("--concurrency", type=int, default=64, help="worker --concurrency (default 64)")
    p.add_argument("--steps", default="async", choices=sorted(FLOW_IDS), help="sync or async def steps")
    p.add_argument("--top", type=int, default=25, help="functions listed by self time (default 25)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.add_argument("--raw", type=Path, help="fold this py-spy raw file of an earlier run (no run)")
    args = p.parse_args(argv)
    result = refold(args) if args.raw else profile(args)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(
        f"{result['steps']} steps, concurrency {result['concurrency']}: {result['executions_per_s']} executions/s, "
        f"worker CPU {result['worker_cpu_us_per_step']} µs per step ({result['samples']} busy samples)"
    )
    print("\nby area (innermost plaita package on the stack), µs per step:")
    for area, us in result["area_us_per_step"]:  # type: ignore[attr-defined]
        print(f"  {us:8.1f}  {area}")
    print(f"\ntop {args.top} by self time, µs per step:")
    for where, us in result["self_us_per_step"]:  # type: ignore[attr-defined]
        print(f"  {us:8.1f}  {where}")


if __name__ == "__main__":
    main()
