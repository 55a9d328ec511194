"""The soak's independent checker: reads only ``run.json`` (history, producer log, nemesis and
supervisor logs, final Redis state) and judges guarantees 1-10. Imports nothing from plaita.

    python -m bench.soak_checker OUT_DIR        # exit 1 when any guarantee fails

A *run* is one step's start record (S) with the end record (E) of the same process that
follows it; a run without an end was cut short (its process died, or the soak ended).
"""

from __future__ import annotations

import bisect
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench.soak_checks import (
    brief,
    check_fanout,
    check_poison,
    check_sleeps,
    check_ticks,
    faults_between,
    poison_pids,
    result,
)

STEPS = {
    "soak-plain": ["run"],
    "soak-multi": ["m1", "m2", "m3", "m4"],
    "soak-suspend": ["before", "wait_event", "after"],
    "soak-retry": ["r1", "flaky", "r3"],
    "soak-fanout": ["spawn", "after_join"],
    "soak-child": ["work"],
    "soak-sleep": ["nap", "wake"],
    "soak-tick": ["tick"],
    "soak-poison": ["bite"],
}
#: Guarantee 6: a plain task's re-run is explained when its previous run ended at most this
#: long before its process died (one ack round trip, generously, on a loaded 2-core machine).
ACK_ROUND_TRIP_S = 1.0
#: Guarantee 7: recovery (see ``recovery_s``) must come within this after the nemesis stops.
RECOVERY_BOUND_S = 30.0
#: Guarantee 7: a plain task is served promptly when it starts within this of its XADD.
PROMPT_S = 2.0
#: Guarantee 7: slack over --drain-timeout-s for a worker's exit after SIGTERM (python exit).
DRAIN_SLACK_S = 3.0


def runs(history: list[dict[str, Any]], deaths: dict[int, float], t_end: float) -> dict[str, list[dict[str, Any]]]:
    """Runs per execution id, in start order."""
    open_runs: dict[tuple[str, str, int], dict[str, Any]] = {}
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for rec in sorted(history, key=lambda r: r["t"]):
        key = (rec["id"], rec["step"], rec["pid"])
        if rec["kind"] == "S":
            run = {**rec, "end": None, "outcome": None}
            open_runs[key] = run
            out[rec["id"]].append(run)
        elif rec["kind"] == "E" and key in open_runs:
            run = open_runs.pop(key)
            run["end"], run["outcome"] = rec["t"], rec.get("outcome")
    for eid_runs in out.values():
        for run in eid_runs:
            run["cut"] = run["end"] is None
            if run["cut"]:
                run["end"] = deaths.get(run["pid"], t_end)
    return out


def check_enqueues(d: dict[str, Any], by_id: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Every acknowledged start ran a step, and every acknowledged resume its resumed step. A start
    the producer cancelled may end ``cancelled`` before its first step: that is the cancel landing
    early, not a lost enqueue, and it is counted apart."""
    acked = [r for r in d["producer"] if "mid" in r]
    cancelled_by_producer = {r["id"] for r in d["producer"] if r["op"] == "cancel" and "error" not in r}
    bad, cancelled_early = [], 0
    for r in acked:
        rs = by_id.get(r["id"], [])
        if r["op"] == "start" and not rs:
            if r["id"] in cancelled_by_producer and d["executions"].get(r["id"], {}).get("status") == "cancelled":
                cancelled_early += 1
                continue
            bad.append({"id": r["id"], "mid": r["mid"], "why": "start acknowledged, never ran"})
        status = d["executions"].get(r["id"], {}).get("status")
        if r["op"] == "resume" and status != "cancelled" and not any(x["step"] == "wait_event" for x in rs):
            bad.append({"id": r["id"], "mid": r["mid"], "why": "resume acknowledged, resumed step never ran"})
    note = f"{len(acked)} acknowledged XADDs, {cancelled_early} cancelled before their first step"
    return result("1 no acknowledged enqueue lost", bad, note)


def check_overlap(by_id: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    bad = []
    for eid, rs in by_id.items():
        for i, a in enumerate(rs):
            for b in rs[i + 1 :]:
                if b["t"] >= a["end"]:
                    continue
                if a["pid"] != b["pid"] or a["step"] == b["step"]:
                    bad.append({"id": eid, "a": brief(a), "b": brief(b)})
    return result("2 no two runs of one execution overlap", bad, "run = step start .. its end (or its process' death)")


def check_steps(d: dict[str, Any], by_id: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    bad = []
    flows = {r["id"]: r["flow"] for r in d["producer"] if r["op"] == "start"}
    for eid, rs in by_id.items():
        order = STEPS[flows.get(eid, rs[0]["flow"])]
        first_start = {}
        for r in rs:
            first_start.setdefault(r["step"], r["t"])
        for k, step in enumerate(order[:-1]):
            nxt = first_start.get(order[k + 1])
            late = [r for r in rs if r["step"] == step and nxt is not None and r["t"] > nxt]
            bad += [{"id": eid, "why": f"{step} ran after {order[k + 1]} began", "run": brief(r)} for r in late]
        status = d["executions"].get(eid, {}).get("status")
        for step in order:
            n = d["staged"].get(f"{eid}:{step}", 0)
            if n > 1 or (status == "completed" and n != 1):
                bad.append({"id": eid, "why": f"staged INCR of {step} applied {n} times", "status": status})
    return result("3 completed steps never re-run; staged writes exactly once", bad, "")


def check_terminal(d: dict[str, Any]) -> dict[str, Any]:
    bad = []
    for r in d["producer"]:
        if r["op"] != "start" or "mid" not in r:
            continue
        doc = d["executions"].get(r["id"]) or {}
        status = doc.get("status")
        want = {"cancelled", "completed"} if r["intent"] == "cancel" else {"completed"}
        if status not in want:
            bad.append(
                {
                    "id": r["id"],
                    "flow": r["flow"],
                    "status": status,
                    "step": doc.get("step"),
                    "error": doc.get("error"),
                    "want": sorted(want),
                }
            )
    n = sum(1 for r in d["producer"] if r["op"] == "start" and "mid" in r)
    return result(
        "4 every execution ends as its script intends", bad, f"{n} executions; settle {d['meta']['settle_s']} s"
    )


def check_exits(d: dict[str, Any]) -> dict[str, Any]:
    """Workers exit only when the nemesis made them; keepers only when killed, and at the final
    SIGTERM each is still alive and exits 0 promptly."""
    poisoned = poison_pids(d)
    bad = [e for e in d["supervisor"] if e["event"] == "exit" and not e["expected"] and e["pid"] not in poisoned]
    n = sum(1 for e in d["supervisor"] if e["event"] == "exit")
    n_poison = sum(1 for e in d["supervisor"] if e["event"] == "exit" and not e["expected"] and e["pid"] in poisoned)
    bad += [{"why": "a keeper died by itself", **e} for e in d.get("keepers", []) if e["event"] == "died"]
    bound = d["meta"]["drain_timeout_s"] + DRAIN_SLACK_S
    for k in d["meta"].get("keepers", []):
        if not k["alive"] or k["rc"] != 0 or k["exit_s"] > bound:
            bad.append(
                {"why": f"keeper at the final SIGTERM: alive {k['alive']}, exit {k['rc']} after {k['exit_s']} s", **k}
            )
    kills = sum(1 for e in d.get("keepers", []) if e["event"] == "kill9")
    note = f"{n} worker exits during the soak ({n_poison} by a poison step), all restarted; {kills} keeper kill -9s"
    return result("5 no worker or keeper exited unless the nemesis (or its poison step) made it", bad, note)


def deaths_of(d: dict[str, Any]) -> dict[int, float]:
    return {e["pid"]: e["t"] for e in d["supervisor"] if e["event"] == "exit"}


#: Faults that cut a worker's round trip to Redis: a step that ended just before or during one
#: may have lost its checkpoint (the reply, or the request, never made it) and runs again.
PATH_FAULTS = {"redis_kill9", "redis_sigstop"}
SLOT_PATH_FAULTS = {"proxy_reset", "proxy_blackhole"}


def _cause(d: dict[str, Any], prev: dict[str, Any], deaths: dict[int, float], slots: dict[int, int]) -> str | None:
    """Why ``prev`` (a plain task's run) may have run again, or None when nothing explains it."""
    if prev["cut"]:
        return "cut by its process' death"
    died = deaths.get(prev["pid"])
    if died is not None and 0 <= died - prev["end"] <= ACK_ROUND_TRIP_S:
        return "its process died within one round trip"
    slot = f"slot-{slots.get(prev['pid'])}"
    for f in d["faults"]:
        on_path = f["kind"] in PATH_FAULTS or (f["kind"] in SLOT_PATH_FAULTS and f["target"] == slot)
        if on_path and f["start"] - ACK_ROUND_TRIP_S <= prev["end"] <= f["end"] + ACK_ROUND_TRIP_S:
            return f"checkpoint round trip cut by {f['kind']}"
    return None


def check_duplicates(d: dict[str, Any], by_id: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    deaths = deaths_of(d)
    slots = {e["pid"]: e["slot"] for e in d["supervisor"] if e["event"] == "start"}
    causes: dict[str, int] = defaultdict(int)
    bad = []
    for eid, rs in by_id.items():
        if rs[0]["flow"] != "soak-plain":
            continue
        for prev, again in zip(rs, rs[1:], strict=False):
            cause = _cause(d, prev, deaths, slots)
            causes[cause or "unexplained"] += 1
            if cause is None:
                bad.append(
                    {
                        "id": eid,
                        "first": brief(prev),
                        "again": brief(again),
                        "first_pid_died": deaths.get(prev["pid"]),
                    }
                )
    plain = sum(1 for rs in by_id.values() if rs[0]["flow"] == "soak-plain")
    by_cause = ", ".join(f"{k}: {v}" for k, v in sorted(causes.items())) or "none"
    note = (
        f"{sum(causes.values())} re-runs of {plain} plain tasks ({by_cause}); bound: a re-run only of a run cut by"
        f" a worker's death, or ended within {ACK_ROUND_TRIP_S:g} s (one round trip) of that death or of a fault"
        " on its path to Redis"
    )
    return result("6 plain-task duplicates only around kills", bad, note)


def recovery_s(d: dict[str, Any], by_id: dict[str, list[dict[str, Any]]]) -> float | None:
    """Seconds after the nemesis ended from which on every plain task started within
    ``PROMPT_S`` of its XADD (the workers keep pace with the producer: full throughput)."""
    t_end = d["meta"]["t_nemesis_end"]
    starts = sorted(
        (r["t"], r["id"])
        for r in d["producer"]
        if r["op"] == "start" and "mid" in r and r["flow"] == "soak-plain" and r["t"] >= t_end
    )
    recovered: float | None = None
    for t, eid in starts:
        rs = by_id.get(eid)
        prompt = bool(rs) and rs[0]["t"] - t <= PROMPT_S
        if not prompt:
            recovered = None
        elif recovered is None:
            recovered = max(0.0, t - t_end)
    return recovered


def check_recovery(d: dict[str, Any], by_id: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    bad: list[Any] = []
    rec = recovery_s(d, by_id)
    if rec is None or rec > RECOVERY_BOUND_S:
        bad.append({"why": "no recovery to prompt service after the nemesis", "recovery_s": rec})
    bound = d["meta"]["drain_timeout_s"] + DRAIN_SLACK_S
    for s in d["meta"]["shutdown"]:
        if s["rc"] != 0 or s["exit_s"] > bound:
            bad.append({"why": f"final SIGTERM: exit {s['rc']} after {s['exit_s']} s (bound {bound} s)", **s})
    worst = max((s["exit_s"] for s in d["meta"]["shutdown"]), default=0.0)
    note = f"recovery {rec if rec is None else round(rec, 2)} s (bound {RECOVERY_BOUND_S:g}); final drain max {worst} s"
    return result("7 recovery and drain after the nemesis", bad, note)


def check(d: dict[str, Any]) -> list[dict[str, Any]]:
    by_id = runs(d["history"], deaths_of(d), d["meta"]["t_end"])
    return [
        check_enqueues(d, by_id),
        check_overlap(by_id),
        check_steps(d, by_id),
        check_terminal(d),
        check_exits(d),
        check_duplicates(d, by_id),
        check_recovery(d, by_id),
        check_fanout(d, by_id),
        check_sleeps(d, by_id),
        check_ticks(d, by_id),
        check_poison(d),
    ]


def resumptions(d: dict[str, Any]) -> str:
    """After each Redis freeze or restart: how soon the first step completed (median, max), and
    the max over the gaps no other fault fell into (the others wait out that fault too)."""
    ends = sorted(r["t"] for r in d["history"] if r["kind"] == "E")
    parts = []
    for kind in ("redis_sigstop", "redis_kill9"):
        gaps = sorted(
            (ends[i] - f["end"], f["end"])
            for f in d["faults"]
            if f["kind"] == kind and (i := bisect.bisect_left(ends, f["end"])) < len(ends)
        )
        if not gaps:
            continue
        clean = [g for g, end in gaps if not faults_between(d, end, end + g)]
        worst, worst_end = gaps[-1]
        text = f"{kind} {len(gaps)}: median {gaps[len(gaps) // 2][0]:.2f} s, max {worst:.2f} s"
        text += f" (through {', '.join(faults_between(d, worst_end, worst_end + worst)) or 'no other fault'})"
        parts.append(text + (f", max with no other fault in between {max(clean):.2f} s" if clean else ""))
    return "first step completed after the fault ended: " + ("; ".join(parts) or "no Redis fault")


def summary(d: dict[str, Any], results: list[dict[str, Any]]) -> str:
    m = d["meta"]
    kinds: dict[str, int] = defaultdict(int)
    missed: dict[str, int] = defaultdict(int)
    for f in d["faults"]:
        kinds[f["kind"]] += 1
        # A worker fault on a slot whose worker was restarting, or a command nobody received.
        missed[f["kind"]] += any(m in f["note"] for m in ("not applied", "no live worker", "rc=1", "timed out"))
    lines = [
        f"seed {m['seed']}, {m['duration_s']:.0f} s of faults, {m['workers']} workers, {m['rate_per_s']:g} starts/s",
        "faults (not applied): " + ", ".join(f"{k} {v} ({missed[k]})" for k, v in sorted(kinds.items())),
        f"history records {len(d['history'])}, DLQ {len(d['dlq'])}, stream left {d['stream_len']}",
        resumptions(d),
        "",
        "| guarantee | result | count | note |",
        "|---|---|---|---|",
    ]
    lines += [f"| {r['guarantee']} | {'PASS' if r['ok'] else 'FAIL'} | {r['count']} | {r['note']} |" for r in results]
    for r in results:
        for ex in r["examples"]:
            lines.append(f"  counter-example ({r['guarantee'][:1]}): {json.dumps(ex)[:600]}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m bench.soak_checker OUT_DIR", file=sys.stderr)
        return 2
    out = Path(args[0])
    d = json.loads((out / "run.json").read_text())
    results = check(d)
    text = summary(d, results)
    (out / "summary.md").write_text(text + "\n")
    (out / "results.json").write_text(json.dumps(results, indent=1))
    print(text)
    try:
        from bench.soak_plot import plot

        plot(d, out / "timeline.png")
    except ImportError as exc:  # matplotlib is the bench extra; the verdict does not need it
        print(f"no plot: {exc}", file=sys.stderr)
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
