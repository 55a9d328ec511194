"""The outage record on its own, on a fake clock: when it began, how many retries, why."""

from __future__ import annotations

import pytest
import redis

from plaita.fsm import ErrorKind
from plaita.runtime import outage as outage_module
from plaita.runtime.outage import ERROR_TEXT_MAX, Outage


class Clock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(outage_module.time, "monotonic", c)
    return c


def test_the_first_failure_begins_an_outage_the_next_ones_are_retries(clock: Clock) -> None:
    o = Outage()
    assert not o.active and o.end() is None
    failure, first = o.record(redis.ConnectionError("refused"), "read")
    assert first and o.active and o.retries == 0
    assert (failure.kind, failure.source, failure.text) == (ErrorKind.TRANSIENT, "read", "ConnectionError: refused")
    clock.now_s += 5
    _, first = o.record(redis.TimeoutError("slow"), "ack")
    assert not first and o.retries == 1
    assert o.last is not None and o.last.source == "ack"
    clock.now_s += 2.5
    assert o.end() == (7.5, 1)
    assert not o.active and o.last is None and o.retries == 0 and o.end() is None


def test_a_new_outage_after_an_end_starts_from_zero(clock: Clock) -> None:
    o = Outage()
    o.record(redis.ConnectionError("a"), "read")
    o.record(redis.ConnectionError("b"), "read")
    o.end()
    clock.now_s += 100
    _, first = o.record(redis.ConnectionError("c"), "read")
    assert first and o.retries == 0
    clock.now_s += 1
    assert o.end() == (1.0, 0)


def test_reason_names_the_cause_an_operator_must_fix(clock: Clock) -> None:
    o = Outage()
    assert o.reason() == "backoff"
    o.record(redis.AuthenticationError("invalid password"), "read")
    assert o.reason() == "auth: AuthenticationError: invalid password"
    o.record(redis.ConnectionError("refused"), "read")
    assert o.reason() == "redis transient failure: ConnectionError: refused"


def test_the_error_text_is_bounded(clock: Clock) -> None:
    o = Outage()
    failure, _ = o.record(redis.ConnectionError("x" * 10_000), "read")
    assert len(failure.text) == ERROR_TEXT_MAX
