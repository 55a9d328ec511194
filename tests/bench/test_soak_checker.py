"""The soak's checker and schedule: each guarantee's check fails on a history that breaks it."""

from __future__ import annotations

import copy
import subprocess
import sys
from typing import Any

import pytest

from bench import soak_checker
from bench.soak_nemesis import KINDS, schedule

T0 = 1_000_000.0


def _run(
    eid: str, step: str, t: float, end: float | None, pid: int = 1, flow: str = "soak-plain"
) -> list[dict[str, Any]]:
    base = {"id": eid, "flow": flow, "step": step, "attempt": 1, "pid": pid, "worker": f"w{pid}", "gen": 1}
    recs = [{**base, "kind": "S", "t": t}]
    if end is not None:
        recs.append({**base, "kind": "E", "t": end, "outcome": "ok"})
    return recs


def good_run() -> dict[str, Any]:
    """A clean soak: two plain tasks and a four-step execution, all done, no fault."""
    history = _run("p1", "run", T0 + 1, T0 + 1.1)
    for k, step in enumerate(["m1", "m2", "m3", "m4"]):
        history += _run("m1", step, T0 + 2 + k, T0 + 2.5 + k, pid=2, flow="soak-multi")
    history += _run("p2", "run", T0 + 31, T0 + 31.1)  # after the nemesis: served promptly
    producer = [
        {"op": "start", "id": "p1", "flow": "soak-plain", "intent": "soak-plain", "t": T0 + 0.9, "mid": "1-0"},
        {"op": "start", "id": "m1", "flow": "soak-multi", "intent": "soak-multi", "t": T0 + 1.9, "mid": "2-0"},
        {"op": "start", "id": "p2", "flow": "soak-plain", "intent": "soak-plain", "t": T0 + 30.9, "mid": "3-0"},
    ]
    staged = {"p1:run": 1, "p2:run": 1, **{f"m1:{s}": 1 for s in ("m1", "m2", "m3", "m4")}}
    meta = {
        "seed": 1,
        "duration_s": 30.0,
        "workers": 2,
        "rate_per_s": 1.0,
        "drain_timeout_s": 5.0,
        "t_start": T0,
        "t_nemesis_end": T0 + 30,
        "t_end": T0 + 40,
        "settle_s": 0.1,
        "shutdown": [{"slot": 0, "pid": 1, "rc": 0, "exit_s": 0.2}],
    }
    return {
        "meta": meta,
        "faults": [],
        "producer": producer,
        "history": history,
        "staged": staged,
        "supervisor": [],
        "dlq": [],
        "stream_len": 0,
        "executions": {e: {"status": "completed", "step": None, "error": None} for e in ("p1", "p2", "m1")},
    }


def verdicts(d: dict[str, Any]) -> dict[str, bool]:
    return {r["guarantee"][0]: r["ok"] for r in soak_checker.check(d)}


def test_a_clean_history_passes_every_guarantee() -> None:
    assert verdicts(good_run()) == dict.fromkeys("1234567", True)


def _failing(d: dict[str, Any]) -> set[str]:
    return {k for k, ok in verdicts(d).items() if not ok}


def test_an_acknowledged_start_that_never_ran_fails_1() -> None:
    d = good_run()
    d["history"] = [r for r in d["history"] if r["id"] != "p1"]
    assert "1" in _failing(d)


def test_two_workers_running_one_execution_at_once_fail_2() -> None:
    d = good_run()
    d["history"] += _run("m1", "m2", T0 + 3.1, T0 + 3.3, pid=9, flow="soak-multi")
    assert "2" in _failing(d)


def test_a_step_run_again_after_the_next_began_fails_3() -> None:
    d = good_run()
    d["history"] += _run("m1", "m1", T0 + 20, T0 + 20.2, pid=2, flow="soak-multi")
    assert "3" in _failing(d)


def test_a_staged_write_applied_twice_fails_3() -> None:
    d = good_run()
    d["staged"]["m1:m3"] = 2
    assert _failing(d) == {"3"}


def test_an_execution_left_running_fails_4() -> None:
    d = good_run()
    d["executions"]["m1"]["status"] = "running"
    assert "4" in _failing(d)


def test_an_exit_the_nemesis_did_not_cause_fails_5() -> None:
    d = good_run()
    d["supervisor"].append({"event": "exit", "slot": 0, "pid": 5, "rc": 1, "expected": False, "t": T0 + 9})
    assert _failing(d) == {"5"}


def test_a_plain_rerun_without_a_worker_death_fails_6_and_one_after_a_kill_passes() -> None:
    d = good_run()
    d["history"] += _run("p1", "run", T0 + 5, T0 + 5.1, pid=3)
    assert "6" in _failing(d)
    killed = copy.deepcopy(d)
    killed["supervisor"].append({"event": "exit", "slot": 0, "pid": 1, "rc": -9, "expected": True, "t": T0 + 1.3})
    assert "6" not in _failing(killed)


def test_a_slow_final_drain_or_no_recovery_fails_7() -> None:
    d = good_run()
    d["meta"]["shutdown"][0]["exit_s"] = 9.5
    assert _failing(d) == {"7"}
    late = good_run()
    late["history"] = [r for r in late["history"] if r["id"] != "p2"] + _run("p2", "run", T0 + 40, T0 + 40.1)
    assert "7" in _failing(late)


def test_the_checker_imports_nothing_from_plaita() -> None:
    code = "import sys, bench.soak_checker; print(sorted(m for m in sys.modules if m.split('.')[0] == 'plaita'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=30)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("seed", [1, 7, 14])
def test_the_schedule_is_a_function_of_the_seed(seed: int) -> None:
    faults = schedule(seed, 120.0, 3)
    assert faults == schedule(seed, 120.0, 3)
    assert faults != schedule(seed + 1, 120.0, 3)
    assert all(f.at_s > 0 and f.at_s + f.duration_s <= 120.0 and f.kind in KINDS for f in faults)
    assert {f.target for f in faults} <= {"redis", "slot-0", "slot-1", "slot-2"}


def test_a_plain_rerun_after_a_reset_on_its_own_path_passes_6_but_not_on_another_path() -> None:
    d = good_run()
    d["history"] += _run("p1", "run", T0 + 5, T0 + 5.1, pid=3)
    d["supervisor"].append({"event": "start", "slot": 0, "pid": 1, "t": T0})
    reset = {"kind": "proxy_reset", "target": "slot-0", "start": T0 + 1.15, "end": T0 + 1.15, "note": ""}
    d["faults"].append(reset)
    assert "6" not in _failing(d)
    d["faults"][-1] = {**reset, "target": "slot-1"}
    assert "6" in _failing(d)
