"""plaita.testing's parts that need no server: the test clock and a step's context."""

from __future__ import annotations

import asyncio
import time

import pytest

from plaita.clock import wall_s
from plaita.flows import Child, Flow, Resume, Sleep, StepContext
from plaita.testing import TestClock, run_step, step_context


def test_the_test_clock_runs_with_real_time_and_only_moves_ahead() -> None:
    clock = TestClock()
    assert abs(clock() - time.time()) < 1
    clock.advance(3 * 86400)
    assert abs(clock() - time.time() - 3 * 86400) < 1 and clock.offset_s == 3 * 86400
    with pytest.raises(ValueError, match="only moves ahead"):
        clock.advance(-1)
    with pytest.raises(ValueError, match="finite"):
        clock.advance(float("nan"))
    before = clock.offset_s
    clock.advance_to(time.time() - 60)  # a time already past: nothing moves
    assert clock.offset_s == before


def test_an_installed_clock_is_plaitas_wall_clock_until_uninstalled() -> None:
    with TestClock() as clock:
        clock.advance(1000)
        assert wall_s() - time.time() > 999
        # A sleep's deadline and a sleep_until's bound are on it too.
        ctx = step_context()
        assert isinstance(ctx.sleep_until(clock() + 60), Sleep)
    assert abs(wall_s() - time.time()) < 1


def test_a_step_context_has_its_own_cancel_flag_children_and_published_events() -> None:
    published: dict[str, object] = {}
    children = [Child("c0", "completed", {"n": 1}), Child("c1", "error", error={"type": "Boom"})]
    ctx = step_context(params={"a": 1}, children=children, cancelled=True, published=published)
    assert ctx.children == children and ctx.cancelled and ctx.params == {"a": 1}
    ctx.set_progress(0.5)
    assert published == {"progress": 0.5}
    assert not step_context().cancelled and step_context().children is None
    with pytest.raises(ValueError, match="either children or resume"):
        step_context(children=children, resume=Resume("event", 1))


def test_run_step_runs_sync_and_async_steps_and_shows_staged_writes() -> None:
    flow = Flow("kit")

    @flow.step
    def count(ctx: StepContext) -> dict[str, int]:
        ctx.stage_incr("hits", 2)
        return {"n": ctx.params["n"] + 1}

    @flow.step
    async def later(ctx: StepContext) -> Sleep:
        await asyncio.sleep(0)
        return ctx.sleep(3 * 86400)

    done = run_step(flow, "count", params={"n": 1})
    assert done.value == {"n": 2} and done.staged == [("incrby", "hits", "2")] and done.ctx.flow_id == "kit"
    assert isinstance(run_step(flow, "later").value, Sleep)
    with pytest.raises(ValueError, match="no step 'nope'"):
        run_step(flow, "nope")
