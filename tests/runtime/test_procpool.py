"""``ProcessPool`` alone, on real child processes (no Redis): what crosses its pipes, and the
rules that keep one run from touching another's."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from plaita.errors import ChildProcessDied, StepCancelled, StepRaised, StepTimeLimit
from plaita.runtime.procpool import ProcessPool
from plaita.tasks import CancelFlag
from tests.support.pooljobs import Job, NeedsTwo

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def pool() -> Iterator[ProcessPool]:
    p = ProcessPool(1, max_tasks_per_child=3, preload=["tests.support.pooljobs"], cancel_grace_s=5.0).start()
    try:
        yield p
    finally:
        p.close()


def _run(pool: ProcessPool, job: Job, on_request: Any = None, cancel: CancelFlag | None = None) -> Any:
    return pool.run(job, cancel=cancel or CancelFlag(), time_limit_s=None, on_request=on_request or (lambda *a: None))


def test_a_live_call_returns_its_value_and_raises_its_error_in_the_child(pool: ProcessPool) -> None:
    calls: list[tuple[Any, ...]] = []

    def answer(*args: Any) -> str:
        calls.append(args)
        return "ok"

    assert _run(pool, Job("ask"), answer) == "ok"
    assert calls == [("publish", "name", 1)]

    def refuse(*_args: Any) -> None:
        raise ValueError("bad event name")

    with pytest.raises(ValueError, match="bad event name"):
        _run(pool, Job("ask"), refuse)


def test_an_exception_that_cannot_cross_arrives_as_step_raised_with_its_class_name(pool: ProcessPool) -> None:
    with pytest.raises(StepRaised) as caught:
        _run(pool, Job("raise_two"))
    assert caught.value.kind == "NeedsTwo" and str(caught.value) == "NeedsTwo: 1 and 2"
    assert "in the step's child process" in "".join(caught.value.__notes__)  # the child's traceback


def test_a_cancel_reaches_its_own_run_and_never_the_next(pool: ProcessPool) -> None:
    cancel = CancelFlag()
    timer = threading.Timer(0.1, cancel.set)
    timer.start()
    assert _run(pool, Job("wait_cancel", 10.0), cancel=cancel) is True  # returned within the grace
    timer.join()
    # The cancel of the run before was forwarded once and stays with it: this one is not cancelled.
    assert _run(pool, Job("wait_cancel", 0.3)) is False


def test_a_child_is_replaced_after_max_tasks(pool: ProcessPool) -> None:
    pids = [_run(pool, Job("pid")) for _ in range(7)]
    assert [len(set(pids[i : i + 3])) for i in (0, 3)] == [1, 1] and len(set(pids)) == 3, pids
    assert pool.replaced == 2


def test_a_batch_that_loses_its_child_keeps_what_ran_and_never_started_the_rest(pool: ProcessPool) -> None:
    jobs = [Job("pid"), Job("pid"), Job("exit"), Job("pid")]
    results, error = pool.run_batch(jobs, [CancelFlag() for _ in jobs], on_request=lambda *a: None)
    assert [ok for ok, _ in results] == [True, True] and len({pid for _, pid in results}) == 1
    assert isinstance(error, ChildProcessDied) and error.exit_code == 3
    assert _run(pool, Job("pid")) != results[0][1]  # replaced at once


def test_plain_successes_before_a_crash_in_a_batch_are_kept_though_never_sent(pool: ProcessPool) -> None:
    """The child sends plain successes (None) with the next other result or at the end; a crash
    before that loses the message, not the fact: the shared progress counter tells the parent."""
    jobs = [Job("none"), Job("none"), Job("exit"), Job("none")]  # the pool's child runs 3 at most
    results, error = pool.run_batch(jobs, [CancelFlag() for _ in jobs], on_request=lambda *a: None)
    assert results == [(True, None)] * 2 and isinstance(error, ChildProcessDied)


def test_in_a_batch_a_cancel_reaches_a_job_that_has_not_started_yet(pool: ProcessPool) -> None:
    jobs, cancels = [Job("wait_cancel", 0.3), Job("wait_cancel", 5.0)], [CancelFlag(), CancelFlag()]
    cancels[1].set()
    results, error = pool.run_batch(jobs, cancels, on_request=lambda *a: None)
    assert (results, error) == ([(True, False), (True, True)], None)


def test_replacements_are_counted_by_reason() -> None:
    """``ProcessPool.replacements`` (the metric ``plaita_pool_children_replaced_total{reason}``)."""
    pool = ProcessPool(1, max_memory_per_child_mb=1, preload=["tests.support.pooljobs"], cancel_grace_s=0.05).start()
    try:
        assert pool.replacements() == dict.fromkeys(
            ["died", "time_limit", "cancelled", "max_tasks", "max_memory", "other"], 0
        )
        _run(pool, Job("none"))  # any Python's peak RSS is over 1 MiB: recycled after each task
        with pytest.raises(ChildProcessDied):
            _run(pool, Job("exit"))
        with pytest.raises(StepTimeLimit):
            pool.run(Job("sleep", 30.0), cancel=CancelFlag(), time_limit_s=0.2, on_request=lambda *a: None)
        cancel = CancelFlag()
        cancel.set()
        with pytest.raises(StepCancelled):
            _run(pool, Job("sleep", 30.0), cancel=cancel)
        counts = pool.replacements()
    finally:
        pool.close()
    assert counts == {"died": 1, "time_limit": 1, "cancelled": 1, "max_tasks": 0, "max_memory": 1, "other": 0}


def test_in_a_batch_a_cancelled_job_past_its_grace_has_its_child_killed_and_fails_alone() -> None:
    """A lost lease sets a batched task's flag: the job before it keeps its result, the cancelled
    one (deaf to its flag) is killed after the grace and fails with ``StepCancelled``, the one after
    it never started (the caller runs it again elsewhere)."""
    pool = ProcessPool(1, preload=["tests.support.pooljobs"], cancel_grace_s=0.25).start()
    try:
        jobs = [Job("pid"), Job("sleep", 30.0), Job("pid")]
        cancels = [CancelFlag(), CancelFlag(), CancelFlag()]
        timer = threading.Timer(0.2, cancels[1].set)  # while it runs, as a lease loss would come
        timer.start()
        began_s = time.monotonic()
        results, error = pool.run_batch(jobs, cancels, on_request=lambda *a: None)
        took_s = time.monotonic() - began_s
        timer.join()
        assert [ok for ok, _ in results] == [True] and isinstance(results[0][1], int)
        assert isinstance(error, StepCancelled), error
        assert took_s < 10, took_s  # the grace and a tick, not the job's 30 s
        assert pool.replacements()["cancelled"] == 1
        assert _run(pool, Job("pid")) != results[0][1]  # a new child took its place at once
    finally:
        pool.close()


def test_a_batch_that_cannot_be_unpickled_fails_each_job_with_why(pool: ProcessPool) -> None:
    """A batch's jobs cross in one pickle (what they share goes once): one that does not unpickle in
    the child fails every job of it with the reason, and the child goes on."""
    jobs = [Job("pid"), Job("pid", NeedsTwo(1, 2))]  # type: ignore[arg-type]
    results, error = pool.run_batch(jobs, [CancelFlag(), CancelFlag()], on_request=lambda *a: None)
    assert error is None and [ok for ok, _ in results] == [False, False], results
    assert all("NeedsTwo" in str(value) or "argument" in str(value) for _, value in results), results
    assert isinstance(_run(pool, Job("pid")), int)
