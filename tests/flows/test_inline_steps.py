"""``@flow.step(inline=True)``: a sync step run on the runner's event loop (no thread hop), on a
real server under a real lease; everything else as for a sync step on a thread."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from plaita.errors import ConfigError
from plaita.flows import Flow, StepContext
from plaita.flows.model.definition import RetryPolicy
from tests.flows.support import Harness, start

pytestmark = pytest.mark.redis

#: Thread idents each step ran on, by execution id and step name.
RAN_ON: dict[tuple[str, str], int] = {}
#: Set by a step: must not leak into the runner's (the test's) context, as on a thread.
LEAK: contextvars.ContextVar[str] = contextvars.ContextVar("inline_leak", default="unset")
NO_WAIT = RetryPolicy(max_attempts=3, base_s=0.0, cap_s=0.0)

inline = Flow("inline3", retry=NO_WAIT)


@inline.step(inline=True)
def first(ctx: StepContext) -> dict[str, Any]:
    RAN_ON[(ctx.execution_id, "first")] = threading.get_ident()
    LEAK.set("leaked")
    return {"first": ctx.params.get("n", 0) + 1}


@inline.step
def on_thread(ctx: StepContext) -> None:
    RAN_ON[(ctx.execution_id, "on_thread")] = threading.get_ident()


@inline.step(inline=True)
def flaky(ctx: StepContext) -> dict[str, int]:
    """Fails its first ``fail`` attempts (StopIteration: what a thread could not even report)."""
    RAN_ON[(ctx.execution_id, "flaky")] = threading.get_ident()
    if ctx.attempt <= int(ctx.params.get("fail", 0)):
        raise StopIteration("not yet") if ctx.attempt == 1 else RuntimeError(f"attempt {ctx.attempt}")
    return {"flaky": ctx.attempt}


@pytest.fixture
def h(redis_url: str) -> Iterator[Harness]:
    harness = Harness(redis_url, flows=[inline])
    try:
        yield harness
    finally:
        harness.close()


def _run_on_loop(h: Harness, body: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """The task through ``run_async`` as the worker's loop runs it: (last document, loop's thread)."""
    task, lease = h.task(body)

    async def run() -> int:
        await h.runner.run_async(task)
        return threading.get_ident()

    try:
        loop_thread = asyncio.run(run())
    finally:
        h.leases.release(lease)
    doc = h.store.get(task.execution_id)
    assert doc is not None
    return doc, loop_thread


def test_an_inline_step_runs_on_the_loops_thread_and_its_result_is_checkpointed(h: Harness) -> None:
    doc, loop_thread = _run_on_loop(h, start("i1", "inline3", n=41))
    assert doc["status"] == "completed", doc.get("error")
    assert RAN_ON[("i1", "first")] == loop_thread == RAN_ON[("i1", "flaky")]
    assert RAN_ON[("i1", "on_thread")] != loop_thread  # a step without inline still hops to a thread
    assert doc["results"]["first"] == {"first": 42} and doc["state"]["first"] == 42
    assert [e["outcome"] for e in doc["history"]] == ["ok", "ok", "ok"]
    assert LEAK.get() == "unset"  # run in a copy of the context, as on a thread


def test_an_inline_steps_exception_is_a_failed_attempt_retried_per_its_policy(h: Harness) -> None:
    doc, _ = _run_on_loop(h, start("i2", "inline3", fail=2))
    assert doc["status"] == "completed", doc.get("error")
    flaky = [e for e in doc["history"] if e["step"] == "flaky"]
    assert [(e["attempt"], e["outcome"]) for e in flaky] == [(1, "failed"), (2, "failed"), (3, "ok")]
    assert "StopIteration" in flaky[0]["error"] and "attempt 2" in flaky[1]["error"]
    assert doc["results"]["flaky"] == {"flaky": 3}


def test_an_inline_step_failing_every_attempt_ends_the_execution_in_error(h: Harness) -> None:
    doc, _ = _run_on_loop(h, start("i3", "inline3", fail=3))
    assert doc["status"] == "error" and doc["error"]["step"] == "flaky"
    assert doc["error"]["type"] == "RuntimeError" and doc["attempt"] == 3


def test_an_inline_step_runs_on_the_handler_thread_when_flows_run_on_threads(h: Harness) -> None:
    """The thread path (``runner(task)``, ``on_loop=False``) is unchanged: every step runs there."""
    here = threading.get_ident()
    doc = h.run(start("i4", "inline3"))
    assert doc is not None and doc["status"] == "completed", doc and doc.get("error")
    assert RAN_ON[("i4", "first")] == RAN_ON[("i4", "on_thread")] == here


def test_inline_with_a_time_limit_or_on_an_async_step_is_refused() -> None:
    flow = Flow("inline-refused")
    with pytest.raises(ConfigError, match="inline=True cannot take time_limit_s"):

        @flow.step(inline=True, time_limit_s=1.0)
        def limited(ctx: StepContext) -> None:
            pass

    with pytest.raises(ConfigError, match="inline=True is for sync steps"):

        @flow.step(inline=True)
        async def coroutine(ctx: StepContext) -> None:
            pass

    with pytest.raises(ConfigError, match="inline takes True or False, not 'no'"):

        @flow.step(inline="no")  # type: ignore[call-overload]
        def truthy(ctx: StepContext) -> None:
            pass

    assert flow.steps == []
