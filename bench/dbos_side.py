"""The DBOS side of ``bench.vsdbos``: the same 3-step no-op flow as ``bench.flowdefs`` as a DBOS
workflow on SQLite, run to completion ``--executions`` times by ``--concurrency`` callers.

It runs in its own virtual environment (``.venv-dbos``, made by ``bench.vsdbos``: DBOS brings
SQLAlchemy and friends, which plaita's own environment does not need), imports nothing of
plaita, and prints one JSON line: executions/s and the CPU µs per execution of this process
(DBOS runs inside its caller's process; SQLite too, so that is all of its CPU).

    .venv-dbos/bin/python bench/dbos_side.py --executions 1000 --concurrency 4
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from dbos import DBOS


@DBOS.step()
def step_a() -> None:
    pass


@DBOS.step()
def step_b() -> None:
    pass


@DBOS.step()
def step_c() -> None:
    pass


@DBOS.workflow()
def noop3() -> None:
    step_a()
    step_b()
    step_c()


def _cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def run(executions: int, concurrency: int, db: Path) -> dict[str, float]:
    DBOS(config={"name": "plaita-vs-dbos", "system_database_url": f"sqlite:///{db}"})
    DBOS.launch()
    try:
        for _ in range(min(20, executions)):  # warm up: tables, prepared statements, the pool
            noop3()
        started, cpu_before = time.monotonic(), _cpu_s()
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            for future in [pool.submit(noop3) for _ in range(executions)]:
                future.result(timeout=300)
        elapsed, cpu_s = time.monotonic() - started, _cpu_s() - cpu_before
    finally:
        DBOS.destroy()
    return {"executions_per_s": executions / elapsed, "cpu_us_per_execution": cpu_s * 1e6 / executions}


def main() -> None:
    p = argparse.ArgumentParser(prog="bench/dbos_side.py", description=__doc__)
    p.add_argument("--executions", type=int, default=1000)
    p.add_argument("--concurrency", type=int, default=4)
    a = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="plaita-vsdbos-") as d:
        print(json.dumps(run(a.executions, a.concurrency, Path(d) / "dbos.sqlite")), flush=True)


if __name__ == "__main__":
    main()
