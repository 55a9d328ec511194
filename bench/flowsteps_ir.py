"""``python -m bench.flowsteps_ir``: instructions per flow step of the runner and the model, A/B.

The figure a loaded machine does not move (issue 35: the 2-core bench machine is shared, and CPU
µs per execution swing by ±15 % between runs). The 3-step no-op flows of ``bench.flowdefs`` run
through a ``FlowRunner`` on ``MemoryIO`` (``tests/flows/memory.py``: the runner's decisions and
the documents it encodes, no server, no socket) under ``valgrind --tool=callgrind``, 64 at a time
on one event loop as a worker runs them. Two runs of each tree, ``--executions`` and three times
as many, and the difference of their instruction counts per step: interpreter start-up and
imports cancel out. What it leaves out is what a server costs: the store adapter's call and the
loop connection (``bench.flowcurve`` measures those, in µs).

    python -m bench.flowsteps_ir --baseline /tmp/flowbase [--executions 200] [--steps async,sync,inline]

``inline``: the sync flow with ``@flow.step(inline=True)`` steps (``bench.flowdefs.noop3_inline``),
against the baseline's plain sync flow when the baseline has no such flow.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import ROOT

#: Run inside the tree measured (its ``plaita`` and ``tests`` on the path): N executions, 64 at a time.
DRIVER = """
import asyncio, sys
from tests.flows.memory import MemoryRunner, start
import bench.flowdefs as defs
# inline: the sync flow with ``inline=True`` steps; a tree without it (a baseline) runs the plain sync flow
name = {"async": "noop3_async", "sync": "noop3", "inline": "noop3_inline"}[sys.argv[2]]
flow = getattr(defs, name, defs.noop3)
runner = MemoryRunner([flow])
tasks = [runner.task(start(f"e{i}", flow.flow_id)) for i in range(int(sys.argv[1]))]
async def main():
    for i in range(0, len(tasks), 64):
        await asyncio.gather(*(runner.runner.run_async(t) for t in tasks[i : i + 64]))
asyncio.run(main())
runner.close()
"""
STEPS_PER_EXECUTION = 3


def instructions(tree: Path, executions: int, steps: str) -> int:
    """The instructions (Ir) callgrind counts for the driver's whole process in ``tree``."""
    with tempfile.TemporaryDirectory(prefix="plaita-flowir-") as tmp:
        out = Path(tmp) / "callgrind.out"
        command = ["valgrind", "-q", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable]
        env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONHASHSEED": "0"}
        subprocess.run([*command, "-c", DRIVER, str(executions), steps], env=env, cwd=tree, check=True, timeout=900)
        totals = [int(line.split()[1]) for line in out.read_text().splitlines() if line.startswith("totals:")]
    if not totals:
        raise RuntimeError(f"callgrind counted nothing for {tree}")
    return totals[-1]


def per_step(tree: Path, executions: int, steps: str) -> float:
    few, many = instructions(tree, executions, steps), instructions(tree, 3 * executions, steps)
    return (many - few) / (2 * executions * STEPS_PER_EXECUTION)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline", type=Path, required=True, help="a checkout of the plaita to compare with")
    p.add_argument("--executions", type=int, default=200, help="executions of the smaller run (default 200)")
    p.add_argument("--steps", default="async,sync", help="async, sync, inline, comma-separated (default async,sync)")
    args = p.parse_args()
    print("| steps | instructions/step | baseline instructions/step | ratio |")
    print("|---|---|---|---|")
    for steps in args.steps.split(","):
        after, base = per_step(ROOT, args.executions, steps), per_step(args.baseline, args.executions, steps)
        print(f"| {steps} | {after:,.0f} | {base:,.0f} | {after / base:.2f} |", flush=True)


if __name__ == "__main__":
    main()
