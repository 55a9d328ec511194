"""The soak's checker and schedule: each guarantee's check fails on a history that breaks it."""

from __future__ import annotations

import copy
import subprocess
import sys
from typing import Any

import pytest

from bench import soak_checker, soak_checks
from bench.soak_nemesis import KINDS, schedule

T0 = 1_000_000.0


def _run(
    eid: str, step: str, t: float, end: float | None, pid: int = 1, flow: str = "soak-plain", **extra: Any
) -> list[dict[str, Any]]:
    base = {"id": eid, "flow": flow, "step": step, "attempt": 1, "pid": pid, "worker": f"w{pid}", "gen": 1, **extra}
    recs = [{**base, "kind": "S", "t": t}]
    if end is not None:
        recs.append({**base, "kind": "E", "t": end, "outcome": "ok"})
    return recs


KIDS = [f"f1:spawn:0:{i}" for i in range(soak_checks.CHILDREN)]


def _composed() -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, int]]:
    """History, producer records and staged counters of a fan-out parent (its children), a
    durable sleep and two schedule ticks, all done as they should."""
    history = [{"kind": "P", "id": "f1", "flow": "soak-fanout", "step": "spawn", "attempt": 0, "pid": 3, "t": T0 + 3}]
    for i, kid in enumerate(KIDS):
        history += _run(kid, "work", T0 + 4 + i * 0.1, T0 + 4.05 + i * 0.1, pid=3, flow="soak-child")
    saw = [[kid, "completed"] for kid in KIDS]
    history += _run("f1", "spawn", T0 + 5, T0 + 5.1, pid=3, flow="soak-fanout", children=saw)
    history += _run("f1", "after_join", T0 + 5.2, T0 + 5.3, pid=3, flow="soak-fanout")
    history += _run("z1", "nap", T0 + 6, T0 + 6.1, pid=3, flow="soak-sleep", until=T0 + 8)
    history += _run("z1", "wake", T0 + 8.2, T0 + 8.3, pid=3, flow="soak-sleep")
    for tick in (T0 + 10, T0 + 11):
        eid = f"schedule:soak-tick:{int(tick)}"
        history += _run(eid, "tick", tick + 0.5, tick + 0.6, pid=3, flow="soak-tick", tick_s=int(tick))
    producer = [
        {"op": "start", "id": "f1", "flow": "soak-fanout", "intent": "soak-fanout", "t": T0 + 2.9, "mid": "4-0"},
        {"op": "start", "id": "z1", "flow": "soak-sleep", "intent": "soak-sleep", "t": T0 + 5.9, "mid": "5-0"},
    ]
    staged = {"f1:spawn": 1, "f1:after_join": 1, "z1:nap": 1, "z1:wake": 1}
    staged |= {f"{k}:work": 1 for k in KIDS} | {f"schedule:soak-tick:{int(T0) + s}:tick": 1 for s in (10, 11)}
    return history, producer, staged


def good_run() -> dict[str, Any]:
    """A clean soak: two plain tasks, a four-step execution, a fan-out, a sleep and two ticks
    of the schedule, all done, no fault."""
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
        "tick_from_s": int(T0) + 10,
        "tick_until_s": int(T0) + 11,
    }
    more_history, more_producer, more_staged = _composed()
    ids = {r["id"] for r in history + more_history}
    return {
        "meta": meta,
        "faults": [],
        "producer": producer + more_producer,
        "history": history + more_history,
        "staged": staged | more_staged,
        "supervisor": [],
        "dlq": [],
        "stream_len": 0,
        "executions": {e: {"status": "completed", "step": None, "error": None} for e in ids},
    }


def verdicts(d: dict[str, Any]) -> dict[str, bool]:
    return {r["guarantee"].split()[0]: r["ok"] for r in soak_checker.check(d)}


def test_a_clean_history_passes_every_guarantee() -> None:
    assert verdicts(good_run()) == {str(n): True for n in range(1, 12)}


def _failing(d: dict[str, Any]) -> set[str]:
    return {k for k, ok in verdicts(d).items() if not ok}


def test_an_acknowledged_start_that_never_ran_fails_1() -> None:
    d = good_run()
    d["history"] = [r for r in d["history"] if r["id"] != "p1"]
    assert "1" in _failing(d)


def test_a_start_the_producer_cancelled_before_its_first_step_passes_1() -> None:
    """Soak 2026: ``soak-005974`` ended ``cancelled`` before its first step by the producer's own
    cancel, and the checker called it a lost enqueue. Only a start nobody cancelled may fail 1."""
    d = good_run()
    d["history"] = [r for r in d["history"] if r["id"] != "m1"]
    d["executions"]["m1"]["status"] = "cancelled"
    assert "1" in _failing(d)  # cancelled, but not by the producer: the start was lost
    d["producer"].append({"op": "cancel", "id": "m1", "t": T0 + 2.5, "status_seen": "running"})
    assert "1" not in _failing(d)
    failed_cancel = copy.deepcopy(d)
    failed_cancel["producer"][-1]["error"] = "ConnectionError: cut"
    assert "1" in _failing(failed_cancel)  # a cancel that never reached Redis explains nothing


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


def _poisoned(d: dict[str, Any], deaths: int, status: str = "error") -> dict[str, Any]:
    """``d`` with a poison execution the nemesis started that killed ``deaths`` worker processes."""
    d["faults"].append(
        {
            "kind": "poison_step",
            "target": "redis",
            "at_s": 5.0,
            "start": T0 + 5,
            "end": T0 + 5,
            "note": "id=poison-500 mid=9-0",
        }
    )
    for k in range(deaths):
        pid = 50 + k
        d["history"] += _run("poison-500", "bite", T0 + 6 + k, None, pid=pid, flow="soak-poison")
        d["supervisor"].append({"event": "exit", "slot": 0, "pid": pid, "rc": -9, "expected": False, "t": T0 + 6.1 + k})
    d["executions"]["poison-500"] = {"status": status, "step": "bite", "error": {"type": "WorkerCrashed"}}
    return d


def test_a_poison_step_that_ends_error_within_its_strikes_passes_5_and_11() -> None:
    assert _failing(_poisoned(good_run(), 3)) == set()


def test_a_poison_step_left_running_or_killing_too_often_fails_11() -> None:
    assert _failing(_poisoned(good_run(), 2, status="running")) == {"11"}
    assert _failing(_poisoned(good_run(), 4)) == {"11"}


def test_one_death_over_the_strikes_passes_11_only_when_the_pending_list_was_lost_meanwhile() -> None:
    """Soak 2026: poison-66220 killed 4 workers with --max-crashes 3; a Redis restart and a
    group_destroy between its runs had lost the pending list, so its successor read it as new."""
    lost = _poisoned(good_run(), 4)
    lost["faults"].append({"kind": "group_destroy", "target": "redis", "start": T0 + 7.5, "end": T0 + 7.5, "note": ""})
    assert _failing(lost) == set()
    after = _poisoned(good_run(), 4)  # a loss after its last run excuses nothing
    after["faults"].append({"kind": "group_destroy", "target": "redis", "start": T0 + 20, "end": T0 + 20, "note": ""})
    assert _failing(after) == {"11"}
    five = _poisoned(good_run(), 5)  # one loss excuses one death, not two
    five["faults"].append({"kind": "group_destroy", "target": "redis", "start": T0 + 7.5, "end": T0 + 7.5, "note": ""})
    assert _failing(five) == {"11"}


def test_an_innocent_task_in_the_dlq_fails_11() -> None:
    d = good_run()
    d["dlq"].append({"payload": '{"reason": "max_deliveries", "payload": {"execution_id": "p1"}}'})
    assert _failing(d) == {"11"}


def test_a_keeper_that_died_by_itself_or_was_dead_at_the_end_fails_5() -> None:
    d = good_run()
    d["keepers"] = [{"event": "kill9", "keeper": 0, "pid": 7, "t": T0 + 3}]
    assert _failing(d) == set(), "a kill -9 the soak made is expected"
    d["keepers"].append({"event": "died", "keeper": 1, "pid": 8, "t": T0 + 4})
    assert _failing(d) == {"5"}
    dead = good_run()
    dead["meta"]["keepers"] = [{"keeper": 0, "pid": 9, "alive": False, "rc": 0, "exit_s": 0.1}]
    assert _failing(dead) == {"5"}


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


def test_a_parent_that_went_on_before_a_child_completed_fails_8() -> None:
    d = good_run()
    d["history"] = [r for r in d["history"] if r["id"] != KIDS[1]]
    d["history"] += _run(KIDS[1], "work", T0 + 5.15, T0 + 5.4, pid=3, flow="soak-child")
    assert _failing(d) == {"8"}


def test_a_join_that_saw_a_child_not_completed_fails_8() -> None:
    d = good_run()
    join = next(r for r in d["history"] if r["id"] == "f1" and "children" in r and r["kind"] == "S")
    join["children"] = [[k, "running" if i == 2 else "completed"] for i, k in enumerate(KIDS)]
    assert _failing(d) == {"8"}


def test_a_second_set_of_children_fails_8_and_a_child_run_twice_fails_3() -> None:
    d = good_run()
    d["history"] += _run("f1:spawn:1:0", "work", T0 + 4.5, T0 + 4.6, pid=4, flow="soak-child")
    d["executions"]["f1:spawn:1:0"] = {"status": "completed"}
    d["staged"]["f1:spawn:1:0:work"] = 1
    assert _failing(d) == {"8"}
    twice = good_run()
    twice["staged"][f"{KIDS[0]}:work"] = 2
    assert _failing(twice) == {"3"}


def test_children_of_a_start_whose_reply_was_cut_are_its_own_not_strays_8() -> None:
    """Soak 2026: ``soak-008032``'s XADD reply was cut by a fault but the start landed and ran; its
    children were called strays because only acknowledged starts were taken as parents."""
    d = good_run()
    start = next(r for r in d["producer"] if r["id"] == "f1")
    del start["mid"]
    start["error"] = "ConnectionError: reply cut"
    assert "8" not in _failing(d)
    never_ran = copy.deepcopy(d)  # a parent that never ran has no children of its own
    never_ran["history"] = [r for r in never_ran["history"] if r["id"] != "f1"]
    assert "8" in _failing(never_ran)


def test_a_sleep_that_woke_early_or_never_fails_9() -> None:
    d = good_run()
    nap = next(r for r in d["history"] if r["id"] == "z1" and r["step"] == "nap" and r["kind"] == "S")
    nap["until"] = T0 + 9
    assert _failing(d) == {"9"}
    never = good_run()
    never["history"] = [r for r in never["history"] if not (r["id"] == "z1" and r["step"] == "wake")]
    never["staged"].pop("z1:wake")
    assert "9" in _failing(never)


def test_a_missing_or_doubled_tick_fails_10() -> None:
    d = good_run()
    d["meta"]["tick_until_s"] = int(T0) + 12
    assert _failing(d) == {"10"}
    doubled = good_run()
    doubled["staged"][f"schedule:soak-tick:{int(T0) + 10}:tick"] = 2
    assert "10" in _failing(doubled)
    other = good_run()
    run = next(r for r in other["history"] if r["flow"] == "soak-tick")
    run["tick_s"] = int(T0) + 11
    assert _failing(other) == {"10"}


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
