"""Smoke test of ``python -m bench.cluster``: every target drains a few hundred tasks (~6 s).

It catches a producer and a worker that disagree on the keys (the bench would wait for a
backlog no worker reads) long before anyone runs the full bench.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from bench.common import ROOT
from tests.support.redis_cluster import NO_CLI_REASON, redis_cli_missing

pytestmark = [pytest.mark.redis, pytest.mark.skipif(redis_cli_missing(), reason=NO_CLI_REASON)]


def test_every_target_drains_and_reports_a_row() -> None:
    # A subprocess: the bench installs its own SIGTERM handler; --timeout-s bounds each drain.
    args = [sys.executable, "-m", "bench.cluster", "--tasks", "300", "--processes", "1", "--timeout-s", "20"]
    out = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, timeout=55, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [line for line in out.stdout.splitlines() if line.startswith("| ") and " | 1 | " in line]
    targets = [row.split(" | ")[0].lstrip("| ") for row in rows]
    assert targets == [
        "single redis-server, 1 partition",
        "single redis-server, 6 partitions",
        "cluster 3+3, 6 partitions",
    ]
    assert "partition streams per master: " in out.stdout
    spread = out.stdout.split("partition streams per master: ", 1)[1].splitlines()[0]
    assert [part.rsplit(": ", 1)[1] for part in spread.split(", ")] == ["2", "2", "2"]
