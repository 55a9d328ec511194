"""Admission, on ``MemoryIO`` (no server): what a start or resume does before any step runs,
and the tasks it refuses (``BadTaskError``: to the DLQ)."""

from __future__ import annotations

import pytest

from plaita.errors import BadTaskError
from plaita.flows import Flow, StepContext
from tests.flows.memory import memory_runner, resume, start

one = Flow("one")


@one.step
def only(ctx: StepContext) -> int:
    return 1


def test_a_start_of_a_flow_not_loaded_here_is_refused() -> None:
    """No other worker runs it either (``MemoryIO`` has no fleet): the DLQ."""
    with memory_runner([one]) as m:
        with pytest.raises(BadTaskError, match="unknown flow 'nope'"):
            m.run(start("a1", "nope"))
        assert m.io.writes == []
        assert m.io.fleet_view.handovers == {}


def test_a_resume_of_an_unknown_execution_is_refused() -> None:
    with memory_runner([one]) as m, pytest.raises(BadTaskError, match="resume of unknown execution"):
        m.run(resume("a2", "event", data=1))


def test_a_resume_of_a_queued_start_is_refused() -> None:
    """Its start has not run: as for an unknown execution, nothing to resume."""
    with memory_runner([one]) as m:
        m.io.docs["a3"] = {"execution_id": "a3", "status": "queued"}
        with pytest.raises(BadTaskError, match="which is queued"):
            m.run(resume("a3", "event", data=1))


def test_a_second_start_with_a_taken_dedup_key_writes_nothing() -> None:
    with memory_runner([one]) as m:
        m.run({**start("a4", "one"), "dedup_key": "k"})
        before = len(m.io.writes)
        doc = m.run({**start("a5", "one"), "dedup_key": "k"})
    assert doc is None and len(m.io.writes) == before


def test_start_params_that_are_not_an_object_are_refused_before_any_write() -> None:
    with memory_runner([one]) as m:
        with pytest.raises(BadTaskError, match="must be a JSON object"):
            m.run({"type": "start", "flow_id": "one", "execution_id": "a6", "params": [1]})
        assert m.io.writes == []


def test_a_resume_of_an_ended_execution_is_a_no_op() -> None:
    with memory_runner([one]) as m:
        m.run(start("a7", "one"))
        before = len(m.io.writes)
        m.run(resume("a7", "event", data=1, resume_id="late"))
        assert len(m.io.writes) == before
