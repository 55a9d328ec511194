"""FlowTestRunner on the suite's private server: the clock moved by hand reaches a timeout, a
sleep woken early by ``continue``, and a wait nobody ends says what it waits for."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from plaita.flows import Flow, StepContext, WaitTimeout
from plaita.testing import FlowTestRunner, TestClock

pytestmark = pytest.mark.redis

waiter = Flow("kit_waiter")
napper = Flow("kit_napper")
stuck = Flow("kit_stuck")


@waiter.step
def wait(ctx: StepContext) -> Any:
    if ctx.resume is None:
        return ctx.suspend(timeout_s=3600)
    return {"how": ctx.resume.type}


@napper.step
def nap(ctx: StepContext) -> Any:
    return ctx.sleep(10 * 86400)


@napper.step
def up(ctx: StepContext) -> dict[str, bool]:
    return {"up": True}


@stuck.step
def forever(ctx: StepContext) -> Any:
    return ctx.suspend(wait_for="approval") if ctx.resume is None else None


listener = Flow("kit_listener")


@listener.step
def listen(ctx: StepContext) -> Any:
    return {"heard": ctx.recv("news", timeout_s=3600)}


@pytest.fixture
def runner(redis_url: str) -> Iterator[FlowTestRunner]:
    with TestClock() as clock, FlowTestRunner(redis_url, clock) as flow_runner:
        yield flow_runner


def test_a_clock_moved_by_hand_reaches_a_timeout(runner: FlowTestRunner) -> None:
    eid = runner.start(waiter)
    runner.wait_until_waiting(eid)
    started = time.monotonic()
    runner.advance(3601)
    doc = runner.run_until_done(eid, advance=False)  # the keeper's timeout, not a jump of the runner
    assert doc["status"] == "completed" and doc["state"] == {"how": "timeout"}
    assert time.monotonic() - started < 10


def test_a_sleep_woken_early_runs_the_next_step_without_the_clock_moving(runner: FlowTestRunner) -> None:
    eid = runner.start(napper)
    assert runner.wait_until_waiting(eid)["suspension"]["kind"] == "sleep"
    runner.resume(eid, resume_type="continue")
    assert runner.run_until_done(eid, advance=False)["state"] == {"up": True}
    assert runner.clock.offset_s == 0


def test_a_wait_nobody_ends_says_what_it_waits_for(runner: FlowTestRunner) -> None:
    eid = runner.start(stuck)
    with pytest.raises(WaitTimeout, match="waiting in step 'forever' for 'approval'"):
        runner.run_until_done(eid, timeout_s=1.0)
    runner.resume(eid, "yes", wait_for="approval")
    assert runner.run_until_done(eid)["status"] == "completed"


def test_a_message_sent_through_the_kit_reaches_its_recv_and_a_silent_one_times_out(runner: FlowTestRunner) -> None:
    eid = runner.start(listener)
    runner.wait_until_waiting(eid, "news")
    runner.send(eid, "news", {"n": 1}, idempotency_key="k")
    assert runner.run_until_done(eid, advance=False)["results"]["listen"] == {"heard": {"n": 1}}
    quiet = runner.start(listener)
    runner.wait_until_waiting(quiet, "news")
    runner.advance(3601)
    assert runner.run_until_done(quiet, advance=False)["results"]["listen"] == {"heard": None}
