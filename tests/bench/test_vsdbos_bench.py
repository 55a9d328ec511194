"""Smoke test of ``python -m bench.vsdbos`` without DBOS (``--no-dbos``: no ``.venv-dbos`` to build
offline): this plaita against itself as the baseline, with ``appendfsync always``, a few starts
per point; and its bad flags."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bench.common import ROOT

pytestmark = pytest.mark.redis


def test_plaita_and_a_baseline_each_drain_and_report_a_row() -> None:
    args = [sys.executable, "-m", "bench.vsdbos", "--no-dbos", "--baseline", str(ROOT), "--executions", "20"]
    args += ["--repeats", "1", "--concurrency", "4", "--steps", "async"]
    out = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, timeout=55, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [line.split(" | ") for line in out.stdout.splitlines() if line.startswith("| 4 ")]
    assert len(rows) == 1
    assert rows[0][1] == "async" and rows[0][5].endswith("×")  # a ratio to the baseline
    assert "goal: ≥ 2× the baseline at every point" in out.stdout


@pytest.mark.parametrize("bad", [["--steps", "fast"], ["--concurrency", "x"], ["--executions", "1"]])
def test_bad_flags_exit_2_with_a_message(bad: list[str]) -> None:
    out = subprocess.run([sys.executable, "-m", "bench.vsdbos", *bad], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 2
    assert "error:" in out.stderr and "Traceback" not in out.stderr
