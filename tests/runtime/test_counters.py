"""The worker's counters on their own: one writer path that also tells the observers."""

from __future__ import annotations

import threading

import pytest

from plaita.runtime.counters import COUNTER_NAMES, Counters
from plaita.runtime.observer import Observers


class Recorder:
    def __init__(self) -> None:
        self.counted: list[tuple[str, int]] = []

    def tasks_counted(self, outcome: str, n: int) -> None:
        self.counted.append((outcome, n))


def counters_with(recorder: Recorder) -> Counters:
    observers = Observers()
    observers.attach(recorder)  # type: ignore[arg-type]  # it implements only what it records
    return Counters(observers)


def test_add_counts_and_tells_the_observers_and_zero_tells_nobody() -> None:
    rec = Recorder()
    c = counters_with(rec)
    c.add("completed", 3)
    c.add("completed")
    c.add("failed", 0)
    assert c.completed == 4 and c.failed == 0
    assert rec.counted == [("completed", 3), ("completed", 1)]


def test_snapshot_names_every_counter_and_nothing_else() -> None:
    c = Counters(Observers())
    c.add("bad_keys", 2)
    snap = c.snapshot()
    assert tuple(snap) == COUNTER_NAMES
    assert "observers" not in snap
    assert snap["bad_keys"] == 2 and sum(snap.values()) == 2


def test_an_unknown_counter_name_is_an_error_not_a_new_counter() -> None:
    c = Counters(Observers())
    with pytest.raises(ValueError, match="no counter named 'completd'"):
        c.add("completd")
    with pytest.raises(ValueError):
        c.add("observers")
    assert "completd" not in c.snapshot()


def test_adds_from_many_threads_are_not_lost() -> None:
    c = Counters(Observers())

    def add_many() -> None:
        for _ in range(2000):
            c.add("read")

    threads = [threading.Thread(target=add_many) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert c.read == 16_000
