"""``plaita demo`` with its flow part: a real run on a private Redis it starts itself, and the tally."""

from __future__ import annotations

from pathlib import Path

import pytest

from plaita.cli.demo_flows import EXPECTED_RUNS, FlowDemo
from tests.support.workers import run_cli

pytestmark = pytest.mark.redis


def rows(stdout: str) -> dict[str, str]:
    """The tally's ``key  value`` rows (two spaces of indent, then the key, then two or more spaces)."""
    out = {}
    for line in stdout.splitlines():
        if line.startswith("  ") and "  " in line.strip():
            key, _, value = line.strip().partition("  ")
            out[key] = value.strip()
    return out


def test_demo_runs_the_flow_through_the_freeze_and_a_kill9() -> None:
    done = run_cli("demo", "--tasks", "60", "--freeze-s", "3", timeout_s=90)
    assert done.returncode == 0, done.stdout + done.stderr
    tally = rows(done.stdout)
    assert tally["flow executions"] == "12 started, 12 completed with their resume data"
    assert tally["flow lost"] == "0"
    assert tally["flow worker"].startswith("kill -9: SIGKILL at"), tally["flow worker"]
    # The kill lands in ship, so ship ran again at least once; reserve ended long before it.
    reruns = tally["steps re-run"]
    assert not reruns.startswith("0 ") and "ship 0" not in reruns, reruns
    assert "Traceback" not in done.stdout + done.stderr
    assert tally["result"].startswith("PASS")


def test_tally_fails_when_an_execution_is_missing_or_lacks_its_data(tmp_path: Path) -> None:
    demo = FlowDemo(tmp_path, "t0", lambda _line: None)
    demo.docs = {e: {"status": "completed", "state": {"paid": {"amount": 1}}} for e in demo.ids}
    demo.docs[demo.ids[0]] = {"status": "completed", "state": {}}  # resume data never arrived
    del demo.docs[demo.ids[1]]  # never started
    (tmp_path / "flow-steps.log").write_text(
        "".join(f"1.0 {demo.ids[2]} {step}\n" for step in (*EXPECTED_RUNS, "ship")), encoding="utf-8"
    )
    table, ok = demo.tally(stop_code=0)
    values = dict(table)
    assert not ok and values["flow lost"] == "2"
    assert values["steps re-run"].startswith("1 (") and "ship 1" in values["steps re-run"]
    demo.docs[demo.ids[0]] = demo.docs[demo.ids[1]] = {"status": "completed", "state": {"paid": {"amount": 2}}}
    assert demo.tally(stop_code=0)[1] and not demo.tally(stop_code=None)[1]
