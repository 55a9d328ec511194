"""The soak checker's guarantees 8-11 (composed flows: fan-out, durable sleep, schedule; poison steps) and the
helpers every guarantee's result uses. Like ``bench.soak_checker``, it imports nothing from plaita."""

from __future__ import annotations

import json
from typing import Any

MAX_EXAMPLES = 5


#: Guarantee 8: the children each fan-out parent starts (bench/soak_flows.py ``CHILDREN``).
CHILDREN = 3
#: Guarantee 10: the schedule's execution ids, ``schedule:{flow}:{tick_s}``.
TICK_PREFIX = "schedule:soak-tick:"


def result(name: str, examples: list[Any], note: str) -> dict[str, Any]:
    return {
        "guarantee": name,
        "ok": not examples,
        "count": len(examples),
        "examples": examples[:MAX_EXAMPLES],
        "note": note,
    }


def brief(r: dict[str, Any]) -> dict[str, Any]:
    return {k: r.get(k) for k in ("step", "attempt", "pid", "worker", "gen", "t", "end", "cut", "outcome")}


def _join_run(rs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The parent's run that went on past the join: the last ``spawn`` run with the children's
    outcomes before ``after_join`` first started (the last one at all when it never did)."""
    nxt = min((r["t"] for r in rs if r["step"] == "after_join"), default=float("inf"))
    joins = [r for r in rs if r["step"] == "spawn" and "children" in r and r["t"] < nxt]
    return joins[-1] if joins else None


def _fanout_problems(eid: str, d: dict[str, Any], by_id: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    want = [f"{eid}:spawn:0:{i}" for i in range(CHILDREN)]
    bad = []
    if d["executions"].get(eid, {}).get("status") != "completed":
        return bad  # guarantee 4 reports it
    join = _join_run(by_id.get(eid, []))
    if join is None:
        return [{"id": eid, "why": "completed without a run that saw its children"}]
    seen = [c[0] for c in join["children"]]
    if seen != want or any(c[1] != "completed" for c in join["children"]):
        bad.append({"id": eid, "why": "the join saw other children, or one not completed", "saw": join["children"]})
    for cid in want:
        done = [r for r in by_id.get(cid, []) if r["outcome"] == "ok" and not r["cut"] and r["end"] <= join["t"]]
        if not done or d["executions"].get(cid, {}).get("status") != "completed":
            bad.append({"id": eid, "child": cid, "why": "parent went on before this child completed"})
    return bad


def faults_between(d: dict[str, Any], t0: float, t1: float) -> list[str]:
    """The faults active at some time in (t0, t1): what a long wait there went through."""
    return [
        f"{f['kind']}@{f['start'] - d['meta']['t_start']:.1f}s"
        for f in d["faults"]
        if f["start"] < t1 and f["end"] > t0
    ]


def check_fanout(d: dict[str, Any], by_id: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Each completed parent joined exactly its children, each completed before the join; no
    child id other than ``{parent}:spawn:0:{i}`` ever ran (a second set, or a stray child)."""
    # A start whose XADD reply a fault cut may still have landed and run: every parent that ran is
    # judged (and may have children), not only the acknowledged ones.
    fanouts = [r for r in d["producer"] if r["op"] == "start" and r["flow"] == "soak-fanout"]
    parents = [r["id"] for r in fanouts if "mid" in r or r["id"] in by_id]
    bad = []
    for eid in parents:
        bad += _fanout_problems(eid, d, by_id)
    expected = {f"{p}:spawn:0:{i}" for p in parents for i in range(CHILDREN)}
    started = {r["id"] for r in d["producer"] if r["op"] == "start"}
    for cid, rs in by_id.items():
        if rs[0]["flow"] == "soak-child" and cid not in expected and cid.rsplit(":spawn:", 1)[0] in started:
            bad.append({"id": cid, "why": "a child its parent should not have started (a second set?)"})
    n = sum(1 for rs in by_id.values() if rs[0]["flow"] == "soak-child")
    return result(
        "8 fan-out parents join their own children, once each", bad, f"{len(parents)} parents, {n} children ran"
    )


def check_sleeps(d: dict[str, Any], by_id: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """A durable sleep wakes (the execution completes) and never before its deadline."""
    bad, late = [], []
    sleepers = [r["id"] for r in d["producer"] if r["op"] == "start" and "mid" in r and r["flow"] == "soak-sleep"]
    for eid in sleepers:
        rs = by_id.get(eid, [])
        wake = min((r["t"] for r in rs if r["step"] == "wake"), default=None)
        naps = [r for r in rs if r["step"] == "nap" and (wake is None or r["t"] < wake)]
        if wake is None:
            if d["executions"].get(eid, {}).get("status") == "completed":
                bad.append({"id": eid, "why": "completed without waking"})
            continue
        if not naps or wake < naps[-1]["until"]:
            bad.append(
                {"id": eid, "why": "woke before its deadline", "wake": wake, "nap": brief(naps[-1]) if naps else None}
            )
        else:
            late.append((wake - naps[-1]["until"], naps[-1]["until"]))
    late.sort()
    lateness = ""
    if late:
        worst, due = late[-1]
        in_the_way = faults_between(d, due, due + worst)
        lateness = f"wake after the deadline: median {late[len(late) // 2][0]:.2f} s, max {worst:.2f} s"
        lateness += f" (through {', '.join(in_the_way) or 'no fault'})"
        clean = [g for g, at in late if not faults_between(d, at, at + g)]
        lateness += f", max with no fault in between {max(clean):.2f} s" if clean else ""
    return result("9 durable sleeps wake, never early", bad, f"{len(sleepers)} sleeps; {lateness}")


def check_ticks(d: dict[str, Any], by_id: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Exactly one execution per tick of the every-second schedule: each tick from the first one
    started to ``tick_until_s`` has one execution, completed, its staged write applied once;
    every run of the schedule's flow ran for the tick its id names."""
    lo, hi = d["meta"].get("tick_from_s"), d["meta"].get("tick_until_s")
    if lo is None or hi is None:
        return result("10 one execution per schedule tick", [], "no schedule in this run")
    bad = []
    for eid, rs in by_id.items():
        if rs[0]["flow"] != "soak-tick":
            continue
        wrong = [r for r in rs if f"{TICK_PREFIX}{r.get('tick_s')}" != eid]
        bad += [{"id": eid, "why": "a run for another tick", "run": brief(r), "tick_s": r.get("tick_s")} for r in wrong]
    for t in range(lo, hi + 1):
        eid = f"{TICK_PREFIX}{t}"
        status = d["executions"].get(eid, {}).get("status")
        if status != "completed" or d["staged"].get(f"{eid}:tick", 0) != 1:
            bad.append(
                {
                    "id": eid,
                    "why": "tick not run exactly once",
                    "status": status,
                    "staged": d["staged"].get(f"{eid}:tick", 0),
                }
            )
    return result(
        "10 one execution per schedule tick", bad, f"{max(0, hi - lo + 1)} ticks checked, every second from the first"
    )


#: Guarantee 11: a poison step kills at most this many worker processes (the workers'
#: default ``--max-crashes``) before its execution ends ``error``.
MAX_CRASHES = 3


def poison_pids(d: dict[str, Any]) -> dict[int, str]:
    """Worker pids that started a poison step's run, with its execution id."""
    return {r["pid"]: r["id"] for r in d["history"] if r.get("flow") == "soak-poison" and r["kind"] == "S"}


def _dead_letter_id(entry: dict[str, Any]) -> str:
    try:
        body = json.loads(entry.get("payload", "{}")).get("payload") or {}
    except ValueError:
        return "?"
    return str(body.get("execution_id", "?")) if isinstance(body, dict) else "?"


#: Faults that lose a consumer group's pending list: a crash before one can go uncounted, as the
#: successor finds the task among new entries, not among a dead worker's (docs/reliability.md).
PEL_LOSSES = ("group_destroy", "redis_kill9")


def _pel_losses(d: dict[str, Any], eid: str) -> int:
    """The faults that lost the pending list while ``eid``'s poison step was killing workers."""
    runs = sorted(r["t"] for r in d["history"] if r["id"] == eid and r["kind"] == "S")
    if len(runs) < 2:
        return 0
    return sum(1 for f in d["faults"] if f["kind"] in PEL_LOSSES and runs[0] < f["start"] < runs[-1])


def check_poison(d: dict[str, Any]) -> dict[str, Any]:
    """Every poison execution the nemesis started ends ``error`` (``WorkerCrashed``) having killed
    at most MAX_CRASHES processes, one more per fault that lost the pending list meanwhile; no
    other task is dead-lettered (innocents are never charged)."""
    bad: list[dict[str, Any]] = []
    pids = poison_pids(d)
    deaths: dict[str, int] = {}
    for e in d["supervisor"]:
        if e["event"] == "exit" and not e["expected"] and e["pid"] in pids:
            deaths[pids[e["pid"]]] = deaths.get(pids[e["pid"]], 0) + 1
    started = [
        f["note"].split()[0][3:] for f in d["faults"] if f["kind"] == "poison_step" and f["note"].startswith("id=")
    ]
    excused = 0
    for eid in started:
        doc = d["executions"].get(eid) or {}
        error_type = (doc.get("error") or {}).get("type")
        allowed = MAX_CRASHES + _pel_losses(d, eid)
        excused += deaths.get(eid, 0) > MAX_CRASHES and deaths.get(eid, 0) <= allowed
        if doc.get("status") != "error" or error_type != "WorkerCrashed" or deaths.get(eid, 0) > allowed:
            bad.append({"id": eid, "status": doc.get("status"), "error": error_type, "deaths": deaths.get(eid, 0)})
    innocent = [i for i in map(_dead_letter_id, d["dlq"]) if not i.startswith("poison-")]
    bad += [{"id": i, "why": "an innocent task was dead-lettered"} for i in innocent]
    note = f"{len(started)} poison executions, {sum(deaths.values())} worker deaths by them"
    note += f"; {excused} over {MAX_CRASHES} after the pending list was lost meanwhile" if excused else ""
    return result("11 a poison step fails only itself", bad, note)
