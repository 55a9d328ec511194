"""``python -m bench.vsdbos``: a 3-step no-op flow with ``appendfsync always``, plaita against the same
flow on DBOS with SQLite, and against another plaita (``--baseline``), side by side in one run.

plaita: one worker process (``--flows bench.flowdefs``) on a private redis-server with
``appendfsync always`` (every write on disk before its reply), ``--executions`` starts queued at
once and drained at ``--concurrency``; the point is ``bench.flowcurve.measure``. DBOS:
``bench/dbos_side.py`` in its own virtual environment ``.venv-dbos`` (made on first use with
``pip install dbos==3.4.0``: SQLAlchemy and friends stay out of plaita's environment), the same
number of workflows of three ``@DBOS.step`` functions run to completion by ``--concurrency``
caller threads, its system database a SQLite file (DBOS's default durability). Each point is the
median of ``--repeats`` runs, the three sides alternating which runs first, so load on a shared
machine slows them alike: read the ratios.

    python -m bench.vsdbos [--baseline DIR] [--executions 1000] [--concurrency 4,64] [--repeats 3]

``--baseline DIR``: a checkout of the plaita to compare with, e.g. ``git worktree add /tmp/base
<commit>`` (issue 35: "at least 2x today's executions/s at concurrency 4 and 64").
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from bench.common import ROOT, median
from bench.flowcurve import FLOW_IDS, _source_dir, checked_run_args, measure
from tests.support.redis_server import RedisServer

DBOS_VENV = ROOT / ".venv-dbos"
DBOS_PIN = "dbos==3.4.0"
#: The issue's goal: this plaita against the baseline's executions/s, at each concurrency.
TARGET_VS_BASELINE = 2.0


@dataclass(frozen=True)
class Row:
    concurrency: int
    steps: str
    plaita: float  #: executions/s
    plaita_cpu_us: float  #: worker CPU per execution
    baseline: float | None
    dbos: float | None
    dbos_cpu_us: float | None


def dbos_python() -> Path:
    """The interpreter of ``.venv-dbos``, made (venv + pinned DBOS) on first use."""
    python = DBOS_VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(DBOS_VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", DBOS_PIN], check=True)
    return python


def run_dbos(python: Path, executions: int, concurrency: int) -> tuple[float, float]:
    """(executions/s, CPU µs per execution) of one DBOS run."""
    out = subprocess.run(
        [str(python), str(ROOT / "bench" / "dbos_side.py"), "--executions", str(executions)]
        + ["--concurrency", str(concurrency)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"bench vsdbos: the DBOS side failed ({out.returncode}): {out.stderr[-800:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return float(result["executions_per_s"]), float(result["cpu_us_per_execution"])


def measure_all(args: argparse.Namespace) -> list[Row]:
    python = None if args.no_dbos else dbos_python()
    base = _source_dir(Path(args.baseline)) if args.baseline else None
    rows: list[Row] = []
    with RedisServer(persist=True) as server:  # persist: appendfsync always
        for i, c in enumerate(args.concurrency):
            for kind in args.steps:
                mine: list[tuple[float, float]] = []
                theirs: list[float] = []
                dbos: list[tuple[float, float]] = []
                for r in range(args.repeats):
                    sides = ["plaita", "baseline", "dbos"]
                    for side in sides if (i + r) % 2 == 0 else sides[::-1]:
                        if side == "plaita":
                            m = measure(server.url, ROOT, FLOW_IDS[kind], args.executions, c)
                            mine.append((m[0], m[4]))
                        elif side == "baseline" and base is not None:
                            theirs.append(measure(server.url, base, FLOW_IDS[kind], args.executions, c)[0])
                        elif side == "dbos" and python is not None and kind == "sync":  # DBOS steps are sync
                            dbos.append(run_dbos(python, args.executions, c))
                row = Row(
                    c,
                    kind,
                    median([m[0] for m in mine]),
                    median([m[1] for m in mine]),
                    median(theirs) if theirs else None,
                    median([d[0] for d in dbos]) if dbos else None,
                    median([d[1] for d in dbos]) if dbos else None,
                )
                print(json.dumps(row.__dict__), flush=True)
                rows.append(row)
    return rows


def _n(x: float | None) -> str:
    return "" if x is None else f"{x:,.0f}"


def render(rows: list[Row]) -> str:
    head = (
        "| concurrency | steps | plaita executions/s | plaita worker CPU µs/execution | baseline executions/s |"
        " vs baseline | DBOS (SQLite) executions/s | DBOS CPU µs/execution | vs DBOS |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        vs_base = "" if r.baseline is None else f"{r.plaita / r.baseline:.2f}×"
        vs_dbos = "" if r.dbos is None else f"{r.plaita / r.dbos:.1f}×"
        lines.append(
            f"| {r.concurrency} | {r.steps} | {_n(r.plaita)} | {_n(r.plaita_cpu_us)} | {_n(r.baseline)} | {vs_base} |"
            f" {_n(r.dbos)} | {_n(r.dbos_cpu_us)} | {vs_dbos} |"
        )
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.vsdbos", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--baseline", help="a checkout of the plaita to compare with (its plaita/ is used)")
    p.add_argument("--executions", type=int, default=1000, help="executions per run (default 1000)")
    p.add_argument("--concurrency", default="4,64", help="comma-separated (default 4,64)")
    p.add_argument(
        "--steps",
        default="sync,async",
        help="plaita's steps: sync, async, inline (on the loop), comma-separated (default sync,async)",
    )
    p.add_argument("--repeats", type=int, default=3, help="runs per point, median kept (default 3)")
    p.add_argument("--no-dbos", action="store_true", help="leave DBOS out (no .venv-dbos needed)")
    return checked_run_args(p, p.parse_args(argv))


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    rows = measure_all(args)
    print(f"\n{args.executions} executions per run, median of {args.repeats}, appendfsync always.\n")
    print(render(rows))
    if args.baseline:
        worst = min((r.plaita / r.baseline for r in rows if r.baseline), default=0.0)
        met = "met" if worst >= TARGET_VS_BASELINE else "missed"
        print(f"goal: ≥ {TARGET_VS_BASELINE:g}× the baseline at every point: worst {worst:.2f}× ({met})")


if __name__ == "__main__":
    main()
