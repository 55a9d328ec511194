"""A task that killed its worker process too often, and branches between steps, on ``MemoryIO``
(no server)."""

from __future__ import annotations

import pytest

from plaita.errors import BadTaskError
from plaita.flows import Flow, StepContext
from tests.flows.memory import memory_runner, start

RAN: list[str] = []

crashy = Flow("crashy")


@crashy.step
def boom(ctx: StepContext) -> None:
    RAN.append(ctx.execution_id)


brancher = Flow("brancher")


@brancher.step
def choose(ctx: StepContext) -> None:
    ctx.goto(str(ctx.params["to"]))


@brancher.step
def skipped(ctx: StepContext) -> str:
    return "skipped ran"


@brancher.step
def last(ctx: StepContext) -> str:
    return "last"


def test_a_crash_verdict_ends_the_execution_in_error_without_running_the_step() -> None:
    """``Task.crash_verdict`` (set by ``runtime.suspects``): ``error`` (WorkerCrashed), then the DLQ."""
    with memory_runner([crashy]) as m:
        task = m.task(start("k1", "crashy"))
        task.crash_verdict = "killed its worker 3 times"
        with pytest.raises(BadTaskError, match="killed its worker"):
            m.runner(task)
    doc = m.io.docs["k1"]
    assert doc["status"] == "error" and doc["error"]["type"] == "WorkerCrashed" and "k1" not in RAN


def test_goto_runs_the_named_step_next() -> None:
    with memory_runner([brancher]) as m:
        doc = m.run(start("k2", "brancher", to="last"))
    assert doc is not None and doc["status"] == "completed" and "skipped" not in doc["results"]


def test_goto_an_unknown_step_ends_the_execution_in_error() -> None:
    with memory_runner([brancher]) as m:
        doc = m.run(start("k3", "brancher", to="nowhere"))
    assert doc is not None and doc["status"] == "error" and doc["error"]["type"] == "UnknownStep"
