"""Schedule ticks without a server: a cron string is a UTC schedule that skips missed ticks, ticks
follow a time zone across daylight saving changes, and a cron that never fires is refused naming its
flow."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from plaita.errors import ConfigError
from plaita.flows import Flow, Schedule

#: 2026-12-01 12:00:00 UTC, on every minute and five-minute tick.
T0 = int(datetime(2026, 12, 1, 12, 0, tzinfo=UTC).timestamp())


def at(*date: int) -> float:
    return datetime(*date, tzinfo=UTC).timestamp()  # type: ignore[misc]


def utc(epoch_s: int) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%d %H:%M")


NEVER = ("0 0 30 2 *", "0 0 31 4 *", "0 0 31 2 * 0")


def test_a_cron_string_is_a_utc_schedule_that_skips_missed_ticks() -> None:
    f = Flow("f", schedule="*/5 * * * *")
    assert f.schedule == Schedule("*/5 * * * *", tz="UTC", missed="skip")
    with pytest.raises(ConfigError, match="not a cron expression"):
        Flow("f", schedule="*/5 * *")


def test_ticks_follow_the_time_zone_across_daylight_saving_changes() -> None:
    paris = Schedule("0 9 * * *", tz="Europe/Paris", max_catchup=10)
    # Paris leaves winter time (UTC+1) for summer time (UTC+2) on 2026-03-29.
    spring, _ = paris.due_ticks(
        datetime(2026, 3, 27, 12, tzinfo=UTC).timestamp(), datetime(2026, 3, 30, 12, tzinfo=UTC).timestamp()
    )
    assert [utc(t) for t in reversed(spring)] == ["2026-03-28 08:00", "2026-03-29 07:00", "2026-03-30 07:00"]
    # ...and comes back on 2026-10-25.
    autumn, _ = paris.due_ticks(
        datetime(2026, 10, 23, 12, tzinfo=UTC).timestamp(), datetime(2026, 10, 26, 12, tzinfo=UTC).timestamp()
    )
    assert [utc(t) for t in reversed(autumn)] == ["2026-10-24 07:00", "2026-10-25 08:00", "2026-10-26 08:00"]
    # 02:30 does not exist on 2026-03-29 (runs at 03:00 CEST) and happens twice on 2026-10-25.
    night = Schedule("30 2 * * *", tz="Europe/Paris", max_catchup=10)
    spring, _ = night.due_ticks(at(2026, 3, 28, 12), at(2026, 3, 30, 12))
    assert [utc(t) for t in reversed(spring)] == ["2026-03-29 01:00", "2026-03-30 00:30"]
    autumn, _ = night.due_ticks(at(2026, 10, 24, 12), at(2026, 10, 26, 12))
    assert [utc(t) for t in reversed(autumn)] == ["2026-10-25 00:30", "2026-10-25 01:30", "2026-10-26 01:30"]
    assert utc(Schedule("0 9 * * *").next_tick_s(T0)) == "2026-12-02 09:00"  # UTC by default
    assert utc(paris.next_tick_s(T0)) == "2026-12-02 08:00"


@pytest.mark.parametrize("cron", NEVER)
def test_a_cron_that_never_fires_is_refused_naming_the_flow(cron: str) -> None:
    with pytest.raises(ConfigError, match="never fires"):
        Schedule(cron)
    with pytest.raises(ConfigError, match=r"flow 'nightly'.*never fires"):
        Flow("nightly", schedule=cron)
