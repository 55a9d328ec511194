"""The speed targets of issue 22 as rows of the generated targets table (``bench.report``):
plain tasks near the raw loop at --concurrency 1 and 4, little worker CPU per task, and
leased tasks (bodies with an ``execution_id``) at a fair share of the raw loop. Each is a
ratio or a CPU figure of the same run, never a wall-clock constant."""

from __future__ import annotations

from bench.throughput import ThroughputResult

#: Plain tasks, one worker process, vs the raw loop of the same run (at c1 and at c4).
TARGET_PLAIN_RATIO = 0.8
#: Worker CPU (utime + stime) per plain task, at c1 and at c4.
TARGET_PLAIN_CPU_US = 15.0
#: Leased tasks (a lease per execution before the handler runs) vs the raw loop.
TARGET_LEASED_RATIO = 0.6
CHECKED_CONCURRENCIES = (1, 4)

Row = tuple[str, str, str, bool, str]


def speed_rows(tp: ThroughputResult) -> list[Row]:
    """Rows for the concurrencies measured (none when the run had no single-process runs)."""
    raw1, rows, raw = tp.raw1, [], tp.get(1, 0)
    raw_cpu, raw_redis = (raw.cpu_us_per_task, raw.redis_cpu_us_per_task) if raw is not None else (0.0, 0.0)
    plain = [r for c in CHECKED_CONCURRENCIES if (r := tp.get(1, c)) is not None]
    leased = [r for c in CHECKED_CONCURRENCIES if (r := tp.get(1, c, execution_ids=True)) is not None]
    if plain:
        ratios = ", ".join(f"c{r.concurrency} {r.tasks_per_s / raw1:.2f}×" for r in plain)
        worst = min(r.tasks_per_s / raw1 for r in plain)
        rows.append(
            (
                "plain tasks vs the raw loop, c1 and c4 (each)",
                ratios,
                f"≥ {TARGET_PLAIN_RATIO:g}×",
                worst >= TARGET_PLAIN_RATIO,
                "the slower of the two is under the goal",
            )
        )
        cpus = ", ".join(f"c{r.concurrency} {r.cpu_us_per_task:.1f} µs" for r in plain)
        most = max(r.cpu_us_per_task for r in plain)
        rows.append(
            (
                "worker CPU per plain task, c1 and c4 (each)",
                cpus,
                f"≤ {TARGET_PLAIN_CPU_US:g} µs",
                most <= TARGET_PLAIN_CPU_US,
                f"raw loop {raw_cpu:.1f} µs",
            )
        )
    if leased:
        ratios = ", ".join(f"c{r.concurrency} {r.tasks_per_s / raw1:.2f}×" for r in leased)
        worst_r = min(leased, key=lambda r: r.tasks_per_s)
        why = (
            f"per leased task {worst_r.cpu_us_per_task:.0f} µs worker + {worst_r.redis_cpu_us_per_task:.0f} µs "
            f"redis-server CPU against {raw_cpu:.0f} + {raw_redis:.0f} µs "
            "for the raw loop: two keys with a TTL written per execution at the default --lease-format v1, "
            "one with v2 (see *Leased tasks* below)"
        )
        rows.append(
            (
                "leased tasks (`execution_id`) vs the raw loop, c1 and c4 (each)",
                ratios,
                f"≥ {TARGET_LEASED_RATIO:g}×",
                worst_r.tasks_per_s / raw1 >= TARGET_LEASED_RATIO,
                why,
            )
        )
    return rows
