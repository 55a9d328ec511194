"""``MemoryIO.rewrite_queued`` refuses like the fenced script when the lease moved on (found by
review): a dead-lettered start whose lease another worker holds rewrites nothing, so a test of
that engine decision on ``MemoryIO`` cannot pass where ``StoreIO`` would refuse."""

from __future__ import annotations

import pytest

from plaita.errors import BadTaskError
from plaita.flows import Flow, StepContext
from tests.flows.memory import memory_runner, start

one = Flow("one-fenced-queued")


@one.step
def only(ctx: StepContext) -> int:
    return 1


def test_a_fenced_out_dead_lettered_start_rewrites_nothing() -> None:
    with memory_runner([one]) as m:
        queued = {"execution_id": "q1", "flow_id": "nope", "status": "queued", "version": None}
        m.io.docs["q1"] = {**queued, "created_at": 1.0, "updated_at": 1.0, "params": {}, "step": 0}
        m.io.fenced.add("q1")
        with pytest.raises(BadTaskError, match="unknown flow"):
            m.run(start("q1", "nope"))
        assert [w.what for w in m.io.writes] == []
