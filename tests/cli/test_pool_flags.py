"""``--pool`` and its flags: parsed into Settings, explained in ``--help``, and a bad value exits 2
with one line naming the flag (before anything talks to Redis)."""

from __future__ import annotations

import pytest

from plaita.config import Settings
from plaita.errors import ChildProcessDied, ConfigError, StepCancelled, StepTimeLimit
from plaita.flows import Flow, NonRetryableError, RetryPolicy
from tests.cli.test_options import parse
from tests.support.workers import run_cli


def test_the_pool_flags_reach_settings() -> None:
    s = parse("--pool", "process", "--max-tasks-per-child", "7", "--max-memory-per-child-mb", "300")
    assert (s.pool, s.max_tasks_per_child, s.max_memory_per_child_mb) == ("process", 7, 300)
    assert parse("--step-time-limit-s", "2.5").step_time_limit_s == 2.5
    assert (Settings().pool, Settings().step_time_limit_s) == ("thread", None)
    assert parse(env={"PLAITA_POOL": "process"}).pool == "process"


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (("--pool", "bogus"), "--pool"),
        (("--pool", "process", "--max-tasks-per-child", "0"), "--max-tasks-per-child"),
        (("--pool", "process", "--max-memory-per-child-mb", "0"), "--max-memory-per-child-mb"),
        (("--max-tasks-per-child", "5"), "--max-tasks-per-child"),  # needs --pool process
        (("--step-time-limit-s", "0"), "--step-time-limit-s"),
        (("--step-time-limit-s", "nan"), "--step-time-limit-s"),
    ],
)
def test_a_bad_pool_flag_exits_2_naming_it(argv: tuple[str, ...], flag: str) -> None:
    done = run_cli("worker", "--redis-url", "redis://127.0.0.1:1/0", "--flows", "tests.support.poolsteps", *argv)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines and flag in lines[-1], done.stderr


def test_help_explains_each_pool_flag() -> None:
    text = " ".join(run_cli("worker", "--help").stdout.split())
    for words in (
        "--pool POOL where steps and handlers run",
        "forkserver, or spawn where the platform has no forkserver",
        "--max-tasks-per-child",
        "--max-memory-per-child-mb",
        "--step-time-limit-s",
        "in threads the limit is soft",
    ):
        assert words in text, words


def test_a_step_that_cannot_be_sent_to_a_child_is_refused_at_startup() -> None:
    from plaita.ops.service import build_worker

    flow = Flow("local")
    flow.step(lambda ctx: None, name="anonymous")
    with pytest.raises(ConfigError, match="step local.anonymous cannot be sent to a child process"):
        build_worker(Settings(pool="process"), flows=[flow])


def test_a_dead_child_and_a_time_limit_are_retried_a_cancel_and_verdicts_are_not() -> None:
    policy = RetryPolicy(non_retryable=(StepTimeLimit,))
    assert RetryPolicy().retryable(ChildProcessDied("died", -9))
    assert RetryPolicy().retryable(StepTimeLimit("slow"))
    assert not policy.retryable(StepTimeLimit("slow"))  # a flow may say a time-out is final
    assert not RetryPolicy().retryable(NonRetryableError("no"))
    assert not RetryPolicy().retryable(StepCancelled("cancelled"))
