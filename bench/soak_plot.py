"""The soak's timeline: faults as bands, completed steps per second and runs in flight as lines."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from bench.soak_checker import deaths_of, runs

COLOURS = {
    "redis_sigstop": "tab:red",
    "redis_kill9": "darkred",
    "proxy_blackhole": "tab:purple",
    "proxy_reset": "tab:pink",
    "proxy_latency": "tab:olive",
    "worker_kill9": "black",
    "worker_sigterm": "tab:gray",
    "remote_pause": "tab:cyan",
    "remote_stop": "tab:brown",
    "group_destroy": "tab:orange",
}


def _series(d: dict[str, Any], t0: float) -> tuple[list[int], list[int], list[int]]:
    """Per second since ``t0``: the seconds, steps completed, steps in flight."""
    ends = [r["t"] for r in d["history"] if r["kind"] == "E"]
    horizon = int(max([d["meta"]["t_end"], *ends]) - t0) + 1
    done: dict[int, int] = defaultdict(int)
    delta: dict[int, int] = defaultdict(int)
    for r in d["history"]:
        if r["kind"] == "E":
            done[int(r["t"] - t0)] += 1
    # In flight from whole runs: a run cut by a kill ends at its process' death, not never.
    for rs in runs(d["history"], deaths_of(d), d["meta"]["t_end"]).values():
        for run in rs:
            delta[int(run["t"] - t0)] += 1
            delta[int(run["end"] - t0)] -= 1
    xs = list(range(max(0, horizon)))
    inflight, level = [], 0
    for x in xs:
        level += delta[x]
        inflight.append(max(0, level))
    return xs, [done[x] for x in xs], inflight


def plot(d: dict[str, Any], path: Path) -> None:
    t0 = d["meta"]["t_start"]
    xs, done, inflight = _series(d, t0)
    fig, ax = plt.subplots(figsize=(12, 4.5))
    seen = set()
    for f in d["faults"]:
        lane = 0.0 if f["target"] == "redis" else 0.12 * (1 + int(f["target"].split("-")[1]))
        label = f["kind"] if f["kind"] not in seen else None
        seen.add(f["kind"])
        width = max(f["end"] - f["start"], 0.4)
        ax.axvspan(
            f["start"] - t0,
            f["start"] - t0 + width,
            ymin=lane,
            ymax=lane + 0.1,
            color=COLOURS.get(f["kind"], "grey"),
            alpha=0.6,
            label=label,
        )
    ax.plot(xs, done, color="tab:green", lw=1.2, label="steps completed /s")
    ax.plot(xs, inflight, color="tab:blue", lw=1.0, label="steps in flight")
    ax.axvline(d["meta"]["t_nemesis_end"] - t0, color="k", ls="--", lw=0.8, label="nemesis stops")
    ax.set_xlabel("seconds since the producer started")
    ax.set_ylabel("steps")
    ax.set_title(f"plaita soak, seed {d['meta']['seed']}: fault bands (bottom lane Redis, then one per worker)")
    ax.legend(loc="upper left", fontsize=7, ncol=4)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
