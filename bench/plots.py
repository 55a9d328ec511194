"""PNG plots for docs/benchmarks.md (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt

from bench.latency import LatencyResult
from bench.recovery import FAULT_TITLES, FaultResult
from bench.shutdown import ShutdownResult
from bench.throughput import CONCURRENCIES, PROCESSES, ThroughputResult

DPI = 110
COLORS = {1: "#4c72b0", 2: "#55a868", 4: "#c44e52"}


def throughput(tp: ThroughputResult, path: Path) -> None:
    """Grouped bars: raw loop and each worker concurrency, one bar per process count."""
    groups = [("raw loop", 0)] + [(f"worker\n--concurrency {c}", c) for c in CONCURRENCIES]
    fig, ax = plt.subplots(figsize=(9, 4.8))
    width = 0.8 / len(PROCESSES)
    raw1 = tp.raw1
    top = 0.0
    for j, procs in enumerate(PROCESSES):
        xs, ys = [], []
        for i, (_name, conc) in enumerate(groups):
            r = tp.get(procs, conc)
            if r is not None:
                xs.append(i + (j - (len(PROCESSES) - 1) / 2) * width)
                ys.append(r.tasks_per_s)
        bars = ax.bar(xs, ys, width, label=f"{procs} process{'es' if procs > 1 else ''}", color=COLORS[procs])
        top = max([top, *ys])
        for bar, y in zip(bars, ys, strict=True):
            ax.annotate(
                f"{y:,.0f}\n{y / raw1:.2f}×",
                (bar.get_x() + bar.get_width() / 2, y),
                ha="center",
                va="bottom",
                fontsize=7,
                xytext=(0, 2),
                textcoords="offset points",
            )
    ax.axhline(0.5 * raw1, color="grey", linestyle="--", linewidth=1, label="target: one process ≥ 50 % of raw")
    ax.set_xticks(range(len(groups)), [g[0] for g in groups])
    ax.set_ylabel("tasks / s")
    ax.set_ylim(0, top * 1.22)
    ax.set_title("Throughput, no-op handler (label: tasks/s and ratio to the raw loop with 1 process)")
    ax.legend(loc="upper right", fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def latency(lat: LatencyResult, path: Path) -> None:
    """CDF of enqueue-to-handler-start latency with p50 and p99 marked."""
    ms = sorted(x * 1000 for x in lat.latencies_s)
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot(ms, [(i + 1) / len(ms) for i in range(len(ms))], color="#4c72b0")
    for q, value, color in ((50, lat.p50_s, "#55a868"), (99, lat.p99_s, "#c44e52")):
        ax.axvline(value * 1000, color=color, linestyle="--", linewidth=1)
        ax.text(value * 1000, 0.05 + (0.1 if q == 99 else 0), f" p{q} {value * 1000:.1f} ms", color=color, fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("enqueue → handler start (ms, log scale)")
    ax.set_ylabel("fraction of tasks")
    ax.set_title(
        f"End-to-end latency at {lat.rate_per_s:g} tasks/s offered for {lat.seconds:g} s "
        f"({len(ms)} tasks, concurrency {lat.concurrency})",
        fontsize=10,
    )
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def recovery_timeline(results: list[FaultResult], path: Path) -> None:
    """Completions per 100 ms around the first fault of each kind, the fault window shaded."""
    fig, axes = plt.subplots(len(results), 1, figsize=(9, 2.4 * len(results)), sharex=True)
    axes_list = list(axes) if len(results) > 1 else [axes]
    for ax, r in zip(axes_list, results, strict=True):
        xs = [t for t, _ in r.timeline]
        ys = [c for _, c in r.timeline]
        ax.bar(xs, ys, width=0.1, align="edge", color="#4c72b0")
        steady = sorted(y for y in ys if y > 0)
        cap = max(10.0, 3.0 * steady[len(steady) // 2]) if steady else 10.0
        if max(ys, default=0) > cap:  # the catch-up burst would flatten the steady rate: clip and label it
            ax.set_ylim(0, cap)
            for x, y in zip(xs, ys, strict=True):
                if y > cap:
                    ax.annotate(
                        f"{y} ↑",
                        (x + 0.05, cap),
                        ha="left",
                        va="top",
                        fontsize=7,
                        xytext=(3, -2),
                        textcoords="offset points",
                    )
        ax.axvspan(r.window_s[0], r.window_s[1], color="#c44e52", alpha=0.15, label="fault (Redis unavailable)")
        ax.axvline(
            r.recovery_at_s,
            color="#55a868",
            linestyle="--",
            linewidth=1,
            label=f"first completion, {r.trials[0].recovery_s * 1000:.0f} ms after return",
        )
        ax.set_title(FAULT_TITLES[r.fault], fontsize=9, loc="left")
        ax.set_ylabel("done / 100 ms", fontsize=8)
        ax.legend(loc="upper left", fontsize=7)
        ax.grid(axis="y", alpha=0.3)
    axes_list[-1].set_xlabel("seconds since the fault began")
    fig.suptitle("Recovery timeline (first trial of each fault; producer at 200 tasks/s)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def recovery_times(results: list[FaultResult], path: Path, target_s: float) -> None:
    """Every trial's recovery time per fault kind, with the median and the target."""
    fig, ax = plt.subplots(figsize=(8, 3.6))
    for i, r in enumerate(results):
        ys = [x * 1000 for x in r.recoveries_s]
        xs = [i + (k - (len(ys) - 1) / 2) * (0.5 / max(1, len(ys))) for k in range(len(ys))]
        ax.scatter(xs, ys, s=14, color="#4c72b0", zorder=3)
        ax.hlines(r.median_s * 1000, i - 0.3, i + 0.3, color="#55a868", linewidth=2, zorder=4)
        ax.hlines(r.p95_s * 1000, i - 0.3, i + 0.3, color="#dd8452", linewidth=1, linestyles="dotted", zorder=4)
    ax.axhline(target_s * 1000, color="#c44e52", linestyle="--", linewidth=1)
    ax.text(
        len(results) - 0.5,
        target_s * 1000,
        f"target p95 ≤ {target_s:g} s",
        ha="right",
        va="bottom",
        fontsize=8,
        color="#c44e52",
    )
    ax.set_xticks(range(len(results)), [FAULT_TITLES[r.fault] for r in results], fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("Redis back → first completion (ms)")
    ax.set_title(f"Recovery time, {len(results[0].trials)} trials per fault (green: median, dotted: p95)", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def shutdown(sd: ShutdownResult, path: Path, target_s: float) -> None:
    """SIGTERM-to-exit latency of every trial."""
    fig, ax = plt.subplots(figsize=(8, 3.2))
    ys = [x * 1000 for x in sd.latencies_s]
    ax.scatter(range(1, len(ys) + 1), ys, s=14, color="#4c72b0")
    ax.axhline(target_s * 1000, color="#c44e52", linestyle="--", linewidth=1)
    ax.text(len(ys), target_s * 1000, f"target < {target_s:g} s", ha="right", va="bottom", fontsize=8, color="#c44e52")
    ax.set_ylim(0, max(target_s * 1000 * 1.1, max(ys) * 1.1))
    ax.set_xlabel("trial")
    ax.set_ylabel("SIGTERM → exit (ms)")
    ax.set_title(f"Idle shutdown, {len(ys)} trials (max {sd.max_s * 1000:.0f} ms)", fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
