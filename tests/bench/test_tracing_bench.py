"""Smoke test of ``python -m bench.tracing``: each variant's worker drains a few starts (~10 s)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bench.common import ROOT

pytestmark = pytest.mark.redis


def test_every_variant_drains_and_reports_a_row() -> None:
    args = [sys.executable, "-m", "bench.tracing", "--tasks", "30", "--rounds", "1"]
    out = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, timeout=55, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [line.split(" | ")[0].lstrip("| ") for line in out.stdout.splitlines() if line.startswith("| ")]
    assert rows[1:] == [
        "OpenTelemetry not installed",
        "installed, no tracer provider (default)",
        "SDK + batch processor + in-memory exporter",
    ]
    assert out.stdout.count("untraced check, ") == 2
