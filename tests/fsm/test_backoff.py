"""Tier 1: ``BackoffPolicy`` driven by freezegun's frozen monotonic clock. No Redis, no sleeps."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest
from freezegun import freeze_time

from plaita.fsm import BackoffPolicy, Lifecycle, State
from plaita.fsm.backoff import (
    DEFAULT_BACKOFF_BASE_S,
    DEFAULT_BACKOFF_CAP_S,
    DEFAULT_JITTER,
    DEFAULT_PERSISTENT_BACKOFF_S,
)

FROZEN_AT = "2024-01-01 00:00:00"
EPSILON_S = 0.001


class TestSchedule:
    """Nominal delays double from ``base_s`` and stop at ``cap_s``."""

    def test_nominal_schedule_doubles_then_caps(self) -> None:
        """Nominal delays are base·2^n until the cap, then stay at the cap."""
        policy = BackoffPolicy(base_s=0.1, cap_s=1.0, jitter=0.0)
        nominal = [policy.nominal_delay_s(n) for n in range(7)]
        assert nominal == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0])

    def test_schedule_without_jitter_follows_nominal(self) -> None:
        """Successive schedule() calls return the nominal delays and count attempts."""
        policy = BackoffPolicy(base_s=0.25, cap_s=3.0, jitter=0.0)
        delays = [policy.schedule() for _ in range(6)]
        assert delays == pytest.approx([0.25, 0.5, 1.0, 2.0, 3.0, 3.0])
        assert policy.attempt == 6
        assert policy.last_delay_s == pytest.approx(3.0)

    def test_cap_holds_for_huge_attempt_numbers(self) -> None:
        """Thousands of failures neither overflow nor exceed the cap."""
        policy = BackoffPolicy(base_s=0.1, cap_s=2.0, jitter=0.0)
        assert policy.nominal_delay_s(2_000) == 2.0
        policy.attempt = 10_000
        assert policy.schedule() == 2.0

    def test_defaults(self) -> None:
        """The default policy ramps from 0.1 s to a 1 s cap, jitter 0.5, persistent 5 s."""
        policy = BackoffPolicy()
        assert (policy.base_s, policy.cap_s, policy.persistent_s, policy.jitter) == (
            DEFAULT_BACKOFF_BASE_S,
            DEFAULT_BACKOFF_CAP_S,
            DEFAULT_PERSISTENT_BACKOFF_S,
            DEFAULT_JITTER,
        )
        assert (DEFAULT_BACKOFF_BASE_S, DEFAULT_BACKOFF_CAP_S, DEFAULT_PERSISTENT_BACKOFF_S) == (0.1, 1.0, 5.0)

    def test_persistent_failure_goes_straight_to_persistent_delay(self) -> None:
        """A persistent failure waits persistent_s from the first attempt, with no ramp."""
        policy = BackoffPolicy(base_s=0.1, cap_s=1.0, persistent_s=5.0, jitter=0.0)
        assert policy.schedule(persistent=True) == 5.0
        assert policy.schedule(persistent=True) == 5.0
        assert policy.attempt == 2
        policy.reset()
        assert policy.schedule(persistent=False) == pytest.approx(0.1)


class TestJitter:
    """Jitter only shortens a delay, by at most ``jitter`` of it, reproducibly for a seed."""

    def test_delays_stay_within_bounds(self) -> None:
        """Every jittered delay lies in [nominal·(1-jitter), nominal], and jitter really varies it."""
        policy = BackoffPolicy(base_s=0.1, cap_s=1.0, jitter=0.5, rng=random.Random(1337))
        seen: list[float] = []
        for _ in range(50):
            policy.reset()
            for attempt in range(8):
                nominal = policy.nominal_delay_s(attempt)
                delay = policy.schedule()
                assert nominal * 0.5 <= delay <= nominal
                seen.append(delay / nominal)
        assert min(seen) < 0.6
        assert max(seen) > 0.9

    def test_persistent_delay_is_jittered_within_bounds(self) -> None:
        """The persistent delay is jittered within the same bounds."""
        policy = BackoffPolicy(persistent_s=10.0, jitter=0.2, rng=random.Random(7))
        for _ in range(100):
            assert 8.0 <= policy.schedule(persistent=True) <= 10.0

    def test_same_seed_same_delays(self) -> None:
        """Two policies seeded alike produce the same delays."""
        a = BackoffPolicy(rng=random.Random(42))
        b = BackoffPolicy(rng=random.Random(42))
        assert [a.schedule() for _ in range(10)] == [b.schedule() for _ in range(10)]


class TestDue:
    """``due()`` flips exactly when the armed delay has passed on the monotonic clock."""

    def test_unarmed_policy_is_due(self) -> None:
        """A policy with nothing scheduled is due and has no time remaining."""
        policy = BackoffPolicy()
        assert policy.due() is True
        assert policy.remaining_s() == 0.0

    def test_not_due_just_before_and_due_just_after(self) -> None:
        """due() is False a millisecond before the delay and True a millisecond after it."""
        with freeze_time(FROZEN_AT) as frozen:
            policy = BackoffPolicy(rng=random.Random(1337))
            delay = policy.schedule()
            assert 0.05 <= delay <= 0.1
            assert policy.due() is False
            assert policy.remaining_s() == pytest.approx(delay, abs=1e-6)
            frozen.tick(timedelta(seconds=delay - EPSILON_S))
            assert policy.due() is False
            assert policy.remaining_s() == pytest.approx(EPSILON_S, abs=1e-5)
            frozen.tick(timedelta(seconds=2 * EPSILON_S))
            assert policy.due() is True
            assert policy.remaining_s() == 0.0

    def test_each_attempt_rearms_with_a_longer_delay(self) -> None:
        """Rescheduling after the delay arms a fresh, doubled deadline."""
        with freeze_time(FROZEN_AT) as frozen:
            policy = BackoffPolicy(base_s=1.0, cap_s=8.0, jitter=0.0)
            for expected_s in (1.0, 2.0, 4.0, 8.0, 8.0):
                assert policy.schedule() == expected_s
                frozen.tick(timedelta(seconds=expected_s - EPSILON_S))
                assert policy.due() is False
                frozen.tick(timedelta(seconds=EPSILON_S))
                assert policy.due() is True

    def test_reset_after_success(self) -> None:
        """reset() sets attempt back to 0, disarms the deadline and restarts the ramp at base_s."""
        with freeze_time(FROZEN_AT):
            policy = BackoffPolicy(base_s=0.1, cap_s=1.0, jitter=0.0)
            for _ in range(5):
                policy.schedule()
            assert policy.due() is False
            policy.reset()
            assert policy.attempt == 0
            assert policy.due() is True
            assert policy.remaining_s() == 0.0
            assert policy.schedule() == pytest.approx(0.1)


class TestStopInterruptsBackoff:
    """Stopping never waits for the backoff delay."""

    def test_stop_requested_leaves_backoff_before_delay(self) -> None:
        """A Lifecycle in a one-hour persistent BACKOFF accepts stop_requested at once, delay not elapsed."""
        with freeze_time(FROZEN_AT):
            lc = Lifecycle(initial=State.READING, backoff=BackoffPolicy(persistent_s=3600.0, jitter=0.0))
            lc.trigger("redis_failed", persistent=True)
            assert lc.state is State.BACKOFF
            assert lc.backoff.remaining_s() == 3600.0
            assert lc.may_trigger("backoff_elapsed") is False
            assert lc.trigger("stop_requested") is True
            assert lc.state is State.STOPPING
            assert lc.backoff.due() is False  # no time passed: the stop did not wait
            assert lc.trigger("drained") is True
            assert lc.state is State.STOPPED


class TestValidation:
    """Nonsense policies are rejected at construction."""

    @pytest.mark.parametrize(
        "kwargs",
        [
            {"base_s": 0.0},
            {"base_s": -0.1},
            {"base_s": 2.0, "cap_s": 1.0},
            {"persistent_s": 0.0},
            {"persistent_s": -5.0},
            {"jitter": -0.01},
            {"jitter": 1.01},
        ],
        ids=[
            "base-zero",
            "base-negative",
            "cap-below-base",
            "persistent-zero",
            "persistent-negative",
            "jitter-low",
            "jitter-high",
        ],
    )
    def test_invalid_arguments_raise_value_error(self, kwargs: dict[str, float]) -> None:
        """Each invalid argument raises ValueError."""
        with pytest.raises(ValueError):
            BackoffPolicy(**kwargs)  # type: ignore[arg-type]

    @pytest.mark.parametrize(
        "kwargs",
        [{"jitter": 0.0}, {"jitter": 1.0}, {"base_s": 1.0, "cap_s": 1.0}],
        ids=["jitter-0", "jitter-1", "cap-equals-base"],
    )
    def test_boundary_arguments_are_accepted(self, kwargs: dict[str, float]) -> None:
        """Inclusive boundaries (jitter 0 and 1, cap equal to base) are valid."""
        BackoffPolicy(**kwargs)  # type: ignore[arg-type]
