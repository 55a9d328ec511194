"""The settler on its own: batching, holding a failed batch, closing, deferring, overflow.

The queue is a recorder of what the settler asks of it (which calls, in which order, with
what): which outcomes Redis then settles, and how, is the store's business and tested there.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from plaita.runtime import settler as settler_module
from plaita.runtime.outcomes import HANDBACK, RETRY, Outcome
from plaita.runtime.settler import Phase, Settler
from plaita.store.streams.entries import DeadLetter
from tests.support.ops import holds_for, wait_until


class RecordingQueue:
    """Stands in for ``StreamQueue.settle``/``hand_back``; fails while ``failing`` is set."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.settled: list[tuple[list[str], list[DeadLetter], list[tuple[str, str]]]] = []
        self.handed_back: list[list[str]] = []
        self.failing = False
        self.refuse: set[str] = set()

    def settle(
        self, acks: list[str], dead: list[DeadLetter], releases: list[tuple[str, str]]
    ) -> list[tuple[DeadLetter, str]]:
        with self.lock:
            if self.failing:
                raise ConnectionError("redis down")
            self.settled.append((list(acks), list(dead), list(releases)))
            return [(d, "WRONGTYPE") for d in dead if d.message_id in self.refuse]

    def hand_back(self, entries: list[tuple[str, Any]], releases: list[tuple[str, str]], *, timeout_s: Any) -> None:
        with self.lock:
            if self.failing:
                raise ConnectionError("redis down")
            self.handed_back.append([mid for mid, _ in entries])

    def acked(self) -> list[str]:
        with self.lock:
            return [mid for acks, _, _ in self.settled for mid in acks]


@pytest.fixture
def queue() -> RecordingQueue:
    return RecordingQueue()


@pytest.fixture
def failures() -> list[BaseException]:
    return []


@pytest.fixture
def settler(queue: RecordingQueue, failures: list[BaseException]) -> Iterator[Settler]:
    s = Settler(queue, on_failure=failures.append, max_defer_s=0.5)  # type: ignore[arg-type]
    s.start()
    yield s
    s.close()


def test_outcomes_are_acked_in_order_and_flush_waits_for_them(settler: Settler, queue: RecordingQueue) -> None:
    settler.put_many([Outcome(f"1-{i}") for i in range(5)])
    assert settler.flush(5.0)
    assert queue.acked() == [f"1-{i}" for i in range(5)]
    assert settler.backlog == 0 and settler.unsettled_ids() == set()


def test_a_batch_holds_at_most_settle_batch_outcomes(
    settler: Settler, queue: RecordingQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(settler_module, "SETTLE_BATCH", 3)
    queue.failing = True  # nothing leaves until all 7 are queued
    settler.put(Outcome("0-0"))
    wait_until(lambda: settler.phase is Phase.HELD, 5.0, "the first batch to fail")
    settler.put_many([Outcome(f"1-{i}") for i in range(6)])
    queue.failing = False
    settler.redis_ok()
    assert settler.flush(5.0)
    assert [len(acks) for acks, _, _ in queue.settled] == [3, 3, 1]
    assert queue.acked() == ["0-0", *(f"1-{i}" for i in range(6))]


def test_a_failed_batch_is_held_until_redis_ok_then_sent_again_oldest_first(
    settler: Settler, queue: RecordingQueue, failures: list[BaseException]
) -> None:
    queue.failing = True
    settler.put_many([Outcome("1-0"), Outcome("1-1")])
    wait_until(lambda: settler.phase is Phase.HELD, 5.0, "the batch to fail")
    assert len(failures) == 1 and isinstance(failures[0], ConnectionError)
    # Held: still ours (a reclaim must not take them), and flush gives up at once.
    assert settler.unsettled_ids() == {"1-0", "1-1"}
    started = time.monotonic()
    assert settler.flush(5.0) is False
    assert time.monotonic() - started < 1.0
    queue.failing = False
    settler.put(Outcome("1-2"))
    holds_for(lambda: queue.acked() == [], 0.3, "nothing sent before redis_ok")
    settler.redis_ok()
    assert settler.flush(5.0)
    assert queue.acked() == ["1-0", "1-1", "1-2"]
    assert len(failures) == 1


def test_a_retry_without_a_lease_is_never_sent_one_with_a_lease_releases_it(
    settler: Settler, queue: RecordingQueue
) -> None:
    settler.put_many([Outcome("1-0", RETRY), Outcome("1-1", RETRY, release=("lease:e1", "me"))])
    assert settler.flush(5.0)
    assert queue.settled == [([], [], [("lease:e1", "me")])]


def test_dead_letters_go_in_the_batch_and_refused_ones_are_not_retried(settler: Settler, queue: RecordingQueue) -> None:
    queue.refuse = {"1-1"}
    settler.put_many([Outcome.to_dlq("1-0", "bad", 1, {}), Outcome.to_dlq("1-1", "bad", 1, {})])
    assert settler.flush(5.0)
    assert [[d.message_id for d in dead] for _, dead, _ in queue.settled] == [["1-0", "1-1"]]
    holds_for(lambda: len(queue.settled) == 1, 0.2, "a refused dead letter is not sent again")


def test_after_close_nothing_more_is_taken(settler: Settler, queue: RecordingQueue) -> None:
    settler.put(Outcome("1-0"))
    settler.close()
    settler.put(Outcome("1-1"))
    assert settler.flush(5.0)
    assert queue.acked() == ["1-0"]
    assert settler.unsettled_ids() == set()


def test_a_hand_back_waits_for_its_time_capped_by_max_defer(settler: Settler, queue: RecordingQueue) -> None:
    fields = {"body": b"{}"}
    put_at = time.monotonic()
    settler.put(Outcome("1-0", HANDBACK, fields=fields, not_before_s=put_at + 3600))
    assert settler.unsettled_ids() == {"1-0"} and settler.backlog == 1
    wait_until(lambda: queue.handed_back, 5.0, "the deferred hand-back")
    waited_s = time.monotonic() - put_at
    assert queue.handed_back == [["1-0"]]
    assert 0.4 <= waited_s < 3.0, waited_s  # max_defer_s is 0.5, not the hour asked for
    assert settler.flush(5.0) and queue.acked() == []


def test_close_sends_deferred_hand_backs_at_once(queue: RecordingQueue) -> None:
    patient = Settler(queue, on_failure=lambda _exc: None, max_defer_s=600.0)  # type: ignore[arg-type]
    patient.start()
    patient.put(Outcome("1-0", HANDBACK, fields={"body": b"{}"}, not_before_s=time.monotonic() + 600))
    holds_for(lambda: not queue.handed_back, 0.2, "the hand-back waits while open")
    patient.close()
    assert patient.flush(5.0)
    assert queue.handed_back == [["1-0"]]


def test_an_outage_past_max_unsettled_drops_the_oldest(
    settler: Settler, queue: RecordingQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(settler_module, "MAX_UNSETTLED", 3)
    queue.failing = True
    settler.put(Outcome("1-0"))
    wait_until(lambda: settler.phase is Phase.HELD, 5.0, "the batch to fail")
    settler.put_many([Outcome("1-1"), Outcome("1-2"), Outcome("1-3")])
    assert settler.backlog == 3
    queue.failing = False
    settler.redis_ok()
    assert settler.flush(5.0)
    assert queue.acked() == ["1-1", "1-2", "1-3"]  # the oldest stays pending in Redis: redelivered


@pytest.fixture
def lingering(queue: RecordingQueue) -> Iterator[Settler]:
    """A settler whose linger is far longer than any test waits: only the count, a flush or a
    close can end it."""
    s = Settler(queue, on_failure=lambda _exc: None, linger_s=600.0)  # type: ignore[arg-type]
    s.start()
    yield s
    s.close()


def test_a_lone_ack_waits_at_most_the_linger_then_goes(queue: RecordingQueue) -> None:
    linger_s = 0.3
    s = Settler(queue, on_failure=lambda _exc: None, linger_s=linger_s)  # type: ignore[arg-type]
    s.start()
    try:
        put_at = time.monotonic()
        s.put(Outcome("1-0"))
        wait_until(queue.acked, 5.0, "the lingering ack")
        waited_s = time.monotonic() - put_at
        assert linger_s <= waited_s < 3.0, waited_s
        assert queue.acked() == ["1-0"]
    finally:
        s.close()


def test_outcomes_put_while_lingering_share_one_batch_sent_once_the_count_is_reached(
    lingering: Settler, queue: RecordingQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(settler_module, "ACK_LINGER_TASKS", 4)
    for i in range(3):
        lingering.put(Outcome(f"1-{i}"))
    wait_until(lambda: lingering.phase is Phase.LINGERING, 5.0, "the settler to linger")
    holds_for(lambda: queue.acked() == [], 0.2, "three of four do not end the linger")
    assert lingering.unsettled_ids() == {"1-0", "1-1", "1-2"}  # still ours: no reclaim takes them
    lingering.put(Outcome("1-3"))
    wait_until(queue.acked, 5.0, "the batch the fourth outcome completes")
    assert [acks for acks, _, _ in queue.settled] == [["1-0", "1-1", "1-2", "1-3"]]


def test_a_flush_cuts_the_linger_short(lingering: Settler, queue: RecordingQueue) -> None:
    lingering.put(Outcome("1-0"))
    wait_until(lambda: lingering.phase is Phase.LINGERING, 5.0, "the settler to linger")
    started = time.monotonic()
    assert lingering.flush(5.0)
    assert time.monotonic() - started < 1.0
    assert queue.acked() == ["1-0"]
    # Once the flush returned, lingering is allowed again.
    lingering.put(Outcome("1-1"))
    holds_for(lambda: queue.acked() == ["1-0"], 0.2, "the next outcome lingers again")


def test_close_cuts_the_linger_short_and_the_stop_flush_finds_it_sent(
    lingering: Settler, queue: RecordingQueue
) -> None:
    lingering.put(Outcome("1-0"))
    wait_until(lambda: lingering.phase is Phase.LINGERING, 5.0, "the settler to linger")
    lingering.close()  # what a stop does first (plaita.runtime.stopping), then a bounded flush
    wait_until(queue.acked, 5.0, "the ack close sent without lingering")
    assert lingering.flush(5.0) and queue.acked() == ["1-0"]


def test_after_a_full_batch_the_next_goes_without_lingering(
    lingering: Settler, queue: RecordingQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At a high rate batches fill while one is in flight: there the linger would only add waits."""
    monkeypatch.setattr(settler_module, "ACK_LINGER_TASKS", 4)
    lingering.put_many([Outcome(f"1-{i}") for i in range(4)])  # a full batch: goes at once
    wait_until(lambda: len(queue.acked()) == 4, 5.0, "the full batch")
    started = time.monotonic()
    lingering.put(Outcome("2-0"))
    wait_until(lambda: "2-0" in queue.acked(), 5.0, "the next ack, without lingering")
    assert time.monotonic() - started < lingering.linger_s / 2  # the fixture's linger is long
    lingering.put(Outcome("3-0"))  # that batch held one: low rate again, so this one lingers
    holds_for(lambda: "3-0" not in queue.acked(), 0.2, "a lone ack after a small batch lingers")


class SettleBlips(RecordingQueue):
    """Hands back always; fails the next ``blips`` settles (a Redis blip right after the
    hand-back's own transaction went through)."""

    def __init__(self) -> None:
        super().__init__()
        self.blips = 0

    def settle(
        self, acks: list[str], dead: list[DeadLetter], releases: list[tuple[str, str]]
    ) -> list[tuple[DeadLetter, str]]:
        with self.lock:
            if self.blips:
                self.blips -= 1
                raise ConnectionError("redis blip")
        return super().settle(acks, dead, releases)


def test_a_failed_settle_gives_back_the_window_slots_of_the_hand_backs_that_went_through() -> None:
    """Guards issue 31: a batch's hand-backs go out in a transaction of their own before its
    settle; when the settle then fails, the hand-backs are done (only the rest is kept for a
    retry), so their ack-window slots must come back. The bug put in by hand (the failed
    settle's branch not returning them: ``self._open -= size - len(batch)`` removed) lost one
    slot per blip: after 3 blips a window of 4 had 1 slot left, and a worker whose window is
    spent stalls without a word."""
    queue = SettleBlips()
    failures: list[BaseException] = []
    s = Settler(queue, on_failure=failures.append, window=4)  # type: ignore[arg-type]
    s.start()
    try:
        for blip in range(1, 4):
            assert s.take(2) == 2  # two handlers start a task each
            queue.blips = 1
            s.put_many([Outcome(f"{blip}-0", HANDBACK, fields={"body": b"{}"}), Outcome(f"{blip}-1")])
            s.give_back(2)  # routed: each outcome holds a slot of its own until settled
            wait_until(lambda b=blip: len(failures) == b, 5.0, f"blip {blip} to fail the settle")  # type: ignore[misc]
            s.redis_ok()
            assert s.flush(5.0)
        assert [ids for ids in queue.handed_back] == [["1-0"], ["2-0"], ["3-0"]]  # each once
        assert queue.acked() == ["1-1", "2-1", "3-1"]  # the kept acks went on the retry
        assert s.take(4, block=False) == 4, "ack-window slots lost to failed settles"
    finally:
        s.close()
