"""A failed attempt, on ``MemoryIO`` (no server): the ``retrying`` checkpoint, the retry, and the
end in ``error`` when the policy says so."""

from __future__ import annotations

from plaita.flows import Flow, StepContext
from plaita.flows.model.definition import NonRetryableError
from tests.flows.memory import memory_runner, start

ATTEMPTS: dict[str, int] = {}

wobbly = Flow("wobbly")


@wobbly.step(max_attempts=3, base_s=0.0, cap_s=0.0)
def wobble(ctx: StepContext) -> int:
    key = ctx.execution_id
    ATTEMPTS[key] = ATTEMPTS.get(key, 0) + 1
    if ATTEMPTS[key] < int(ctx.params["ok_at"]):
        raise RuntimeError(f"attempt {ctx.attempt} failed")
    return ctx.attempt


hopeless = Flow("hopeless")


@hopeless.step(max_attempts=5, base_s=0.0, cap_s=0.0)
def give_up(ctx: StepContext) -> None:
    raise NonRetryableError("no retry can fix this")


def test_a_failed_attempt_is_checkpointed_then_the_step_runs_again() -> None:
    """Each failed attempt is one checkpoint of the running execution with the failure in its
    history; the attempt that succeeds completes it."""
    with memory_runner([wobbly]) as m:
        doc = m.run(start("r1", "wobbly", ok_at=3))
    assert doc is not None and doc["status"] == "completed" and doc["results"]["wobble"] == 3
    outcomes = [e["outcome"] for e in doc["history"]]
    assert outcomes == ["failed", "failed", "ok"]
    assert [w.status for w in m.io.writes] == ["running", "running", "running", "completed"]


def test_the_last_attempt_failing_ends_the_execution_in_error() -> None:
    """Past ``max_attempts`` the execution ends ``error``, naming the step and the exception."""
    with memory_runner([wobbly]) as m:
        doc = m.run(start("r2", "wobbly", ok_at=99))
    assert doc is not None and doc["status"] == "error"
    assert doc["error"]["step"] == "wobble" and doc["error"]["type"] == "RuntimeError"
    assert [e["outcome"] for e in doc["history"]] == ["failed", "failed", "error"]


def test_a_non_retryable_error_ends_the_execution_at_the_first_attempt() -> None:
    """``NonRetryableError``: no second attempt, whatever ``max_attempts`` allows."""
    with memory_runner([hopeless]) as m:
        doc = m.run(start("r3", "hopeless"))
    assert doc is not None and doc["status"] == "error"
    assert len(doc["history"]) == 1 and m.io.statuses("r3") == ["running", "error"]


def test_retries_run_the_same_in_loop_mode() -> None:
    """``run_async`` (steps on the worker's loop) decides the same writes."""
    with memory_runner([wobbly]) as m:
        doc = m.run_async(start("r4", "wobbly", ok_at=2))
    assert doc is not None and doc["status"] == "completed"
    assert [e["outcome"] for e in doc["history"]] == ["failed", "ok"]
