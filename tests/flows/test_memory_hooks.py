"""A flow's hooks and the runner's observers, on ``MemoryIO`` (no server): called after the
checkpoint that ended the execution, each guarded."""

from __future__ import annotations

from typing import Any

from plaita.flows import Flow, StepContext
from plaita.flows.model.execution import Execution
from tests.flows.memory import memory_runner, start

CALLED: list[tuple[str, str, str]] = []

hooked = Flow("hooked")


@hooked.step(max_attempts=1)
def maybe_fail(ctx: StepContext) -> str:
    if ctx.params.get("fail"):
        raise ValueError("asked to fail")
    return "fine"


@hooked.on_complete
def completed(ex: Execution) -> None:
    CALLED.append(("complete", ex.execution_id, ex.status))


@hooked.on_error
def errored(ex: Execution) -> None:
    CALLED.append(("error", ex.execution_id, ex.status))


@hooked.on_end
def broken(ex: Execution) -> None:
    raise RuntimeError("a hook's bug")


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []

    def execution_event(self, flow_id: str, event: str) -> None:
        self.events.append(("event", flow_id, event))

    def step_finished(self, flow_id: str, step: str, outcome: str, duration_s: float) -> None:
        self.events.append(("step", step, outcome))

    def execution_failed(self, flow_id: str, execution_id: str, error: dict[str, Any] | None) -> None:
        self.events.append(("failed", execution_id, (error or {}).get("type")))


def test_on_complete_runs_after_the_completed_checkpoint_and_a_raising_hook_is_ignored() -> None:
    with memory_runner([hooked]) as m:
        doc = m.run(start("h1", "hooked"))
    assert doc is not None and doc["status"] == "completed"
    assert ("complete", "h1", "completed") in CALLED and ("error", "h1", "error") not in CALLED


def test_on_error_runs_after_the_error_checkpoint() -> None:
    with memory_runner([hooked]) as m:
        doc = m.run(start("h2", "hooked", fail=True))
    assert doc is not None and doc["status"] == "error"
    assert ("error", "h2", "error") in CALLED and ("complete", "h2", "completed") not in CALLED


def test_observers_hear_of_the_start_each_step_and_the_end() -> None:
    recorder = Recorder()
    with memory_runner([hooked], observer=recorder) as m:
        m.run(start("h3", "hooked"))
        m.run(start("h4", "hooked", fail=True))
    assert recorder.events == [
        ("event", "hooked", "started"),
        ("step", "maybe_fail", "ok"),
        ("event", "hooked", "completed"),
        ("event", "hooked", "started"),
        ("step", "maybe_fail", "failed"),
        ("event", "hooked", "failed"),
        ("failed", "h4", "ValueError"),
    ]
