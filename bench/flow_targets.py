"""Issue 35's flow goals as rows of the generated targets table (``bench.report``): the worker CPU
of a 3-step execution of 0 ms steps at concurrency 64 (``async def`` and sync steps), redis-server
CPU per execution, and a flow step against a plain task's worker CPU of the same run. CPU is
utime + stime (``/proc``) of the worker and ``INFO cpu`` of redis-server over the drain
(``bench.flowcurve.measure``): steadier than rates on a shared machine, and never wall-clock
constants."""

from __future__ import annotations

from dataclasses import dataclass

from bench.common import ROOT, median
from bench.flowcurve import FLOW_IDS, STEPS, measure
from bench.throughput import ThroughputResult

#: Worker CPU per 3-step execution at concurrency 64, by kind of step.
TARGET_FLOW_CPU_US = {"async": 150.0, "sync": 250.0, "inline": 250.0}
#: How each kind of step is named in the table (``inline``: the sync goal, met by the opt-in or not).
KIND_LABEL = {"async": "async steps", "sync": "sync steps", "inline": "sync steps run inline (`inline=True`)"}
#: redis-server CPU per execution (no AOF).
TARGET_FLOW_REDIS_US = 60.0
#: A flow step's worker CPU against a plain task's.
TARGET_STEP_VS_PLAIN = 5.0
CONCURRENCY = 64

Row = tuple[str, str, str, bool, str]


@dataclass(frozen=True)
class FlowCpu:
    executions: int
    #: steps kind -> (worker CPU µs per execution, redis-server CPU µs per execution, executions/s)
    by_steps: dict[str, tuple[float, float, float]]


def run(url: str, executions: int, repeats: int) -> FlowCpu:
    """The median of ``repeats`` drains of ``executions`` starts per kind of step, at c64."""
    by_steps: dict[str, tuple[float, float, float]] = {}
    for kind, flow_id in FLOW_IDS.items():
        runs = [measure(url, ROOT, flow_id, executions, CONCURRENCY) for _ in range(repeats)]
        by_steps[kind] = (median([r[4] for r in runs]), median([r[5] for r in runs]), median([r[0] for r in runs]))
    return FlowCpu(executions, by_steps)


def flow_rows(fc: FlowCpu, tp: ThroughputResult | None) -> list[Row]:
    rows: list[Row] = []
    for kind, (worker_us, _, rate) in fc.by_steps.items():
        goal = TARGET_FLOW_CPU_US[kind]
        rows.append(
            (
                f"worker CPU per 3-step execution, {KIND_LABEL[kind]}, c{CONCURRENCY}",
                f"{worker_us:,.0f} µs ({rate:,.0f} executions/s)",
                f"≤ {goal:g} µs",
                worker_us <= goal,
                "see *Flow steps: where the CPU goes* below",
            )
        )
    redis_us = max(r for _, r, _ in fc.by_steps.values())
    rows.append(
        (
            f"redis-server CPU per execution, c{CONCURRENCY} (the largest of the kinds of step)",
            ", ".join(f"{k} {r:,.0f} µs" for k, (_, r, _) in fc.by_steps.items()),
            f"≤ {TARGET_FLOW_REDIS_US:g} µs",
            redis_us <= TARGET_FLOW_REDIS_US,
            "a create and three checkpoint scripts, the read, the lease and the ack",
        )
    )
    plain = tp.get(1, 1) if tp is not None else None
    if plain is not None:
        step_us = fc.by_steps["async"][0] / STEPS
        ratio = step_us / plain.cpu_us_per_task
        rows.append(
            (
                "a flow step's worker CPU vs a plain task's (async steps c64, plain c1)",
                f"{ratio:.1f}× ({step_us:.0f} µs vs {plain.cpu_us_per_task:.1f} µs)",
                f"≤ {TARGET_STEP_VS_PLAIN:g}×",
                ratio <= TARGET_STEP_VS_PLAIN,
                "a step is a create's share, a checkpoint script and the engine's work around the step",
            )
        )
    return rows
