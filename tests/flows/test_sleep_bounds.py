"""A durable sleep's bounds, checked in the step without a server: a duration or a wake time out of
bounds is refused there, and the values a sleep accepts."""

from __future__ import annotations

import math

import pytest

from plaita.flows.model.context import Sleep, StepContext
from plaita.testing import step_context


def _ctx() -> StepContext:
    return step_context(execution_id="e", flow_id="f", step="s")  # the testing kit's, as users build it


@pytest.mark.parametrize("seconds", [-1, math.nan, math.inf, 10 * 366 * 86400, None, "5", True])
def test_a_sleep_out_of_bounds_is_refused_in_the_step(seconds: object) -> None:
    with pytest.raises(ValueError):
        _ctx().sleep(seconds)  # type: ignore[arg-type]


@pytest.mark.parametrize("until", [math.nan, math.inf, -math.inf, 1e11, None])
def test_a_sleep_until_out_of_bounds_is_refused(until: object) -> None:
    with pytest.raises(ValueError):
        _ctx().sleep_until(until)  # type: ignore[arg-type]


def test_sleep_values() -> None:
    assert _ctx().sleep(0) == Sleep(0.0) and _ctx().sleep(3 * 86400).timeout_s == 3 * 86400
    assert _ctx().sleep_until(5.0).until_s == 5.0  # in the past: wakes at once
