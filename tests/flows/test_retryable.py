"""Which exceptions a step's retry policy retries (no server): decided by ``PlaitaError.retryable``,
not by the class being a plaita error. Before, every ``PlaitaError`` ended the execution at its
first attempt, so a step whose ``FlowClient.wait`` timed out was never tried again."""

from __future__ import annotations

import pytest

from plaita.errors import BadTaskError, ConfigError, PlaitaError
from plaita.flows import NonRetryableError, RetryPolicy
from plaita.flows.producer.client import ExecutionNotFound, WaitTimeout

POLICY = RetryPolicy()


class NotYet(PlaitaError):
    retryable = True


@pytest.mark.parametrize("exc", [WaitTimeout("slow child"), NotYet("later"), ValueError("flaky"), OSError("reset")])
def test_a_passing_failure_is_retried(exc: BaseException) -> None:
    assert POLICY.retryable(exc)


@pytest.mark.parametrize(
    "exc", [NonRetryableError("our bug"), BadTaskError("bad"), ConfigError("flag"), ExecutionNotFound("gone")]
)
def test_a_deliberate_plaita_error_is_not_retried(exc: BaseException) -> None:
    assert not POLICY.retryable(exc)


def test_the_steps_own_non_retryable_list_wins_over_the_attribute() -> None:
    policy = RetryPolicy(non_retryable=(KeyError, WaitTimeout))
    assert not policy.retryable(KeyError("k")) and not policy.retryable(WaitTimeout("t"))
    assert policy.retryable(ValueError("v"))
