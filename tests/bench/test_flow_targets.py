"""The issue-35 flow rows of the generated targets table (``bench.flow_targets.flow_rows``): each goal
is judged against its figure, and the step-vs-plain row appears only when the run measured plain
tasks. Pure: no server."""

from __future__ import annotations

from bench.flow_targets import FlowCpu, flow_rows
from bench.throughput import Throughput, ThroughputResult


def _plain(cpu_us: float) -> ThroughputResult:
    runs = [Throughput(1, 0, 100, 1.0, 100.0), Throughput(1, 1, 100, 1.0, 80.0, cpu_us_per_task=cpu_us)]
    return ThroughputResult(runs, None)


def test_each_goal_is_met_or_missed_by_its_own_figure() -> None:
    fc = FlowCpu(100, {"sync": (251.0, 50.0, 900.0), "async": (150.0, 70.0, 1200.0), "inline": (240.0, 55.0, 1000.0)})
    rows = {name: (measured, met) for name, measured, _, met, _ in flow_rows(fc, _plain(10.0))}
    assert rows["worker CPU per 3-step execution, sync steps, c64"] == ("251 µs (900 executions/s)", False)
    assert rows["worker CPU per 3-step execution, async steps, c64"] == ("150 µs (1,200 executions/s)", True)
    inline = rows["worker CPU per 3-step execution, sync steps run inline (`inline=True`), c64"]
    assert inline == ("240 µs (1,000 executions/s)", True)  # judged by the sync goal
    redis = rows["redis-server CPU per execution, c64 (the largest of the kinds of step)"]
    assert redis == ("sync 50 µs, async 70 µs, inline 55 µs", False)  # the largest one (70) decides
    step = rows["a flow step's worker CPU vs a plain task's (async steps c64, plain c1)"]
    assert step == ("5.0× (50 µs vs 10.0 µs)", True)  # 150/3 µs per step against 10 µs


def test_without_a_plain_run_there_is_no_ratio_row() -> None:
    fc = FlowCpu(100, {"sync": (200.0, 50.0, 900.0), "async": (100.0, 40.0, 1200.0)})
    names = [row[0] for row in flow_rows(fc, None)]
    assert len(names) == 3 and all("vs a plain" not in n for n in names)
