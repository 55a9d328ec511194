"""The outcome router on its own: what reaches the settler, what is counted, in which order."""

from __future__ import annotations

import dataclasses
import threading

import pytest

from plaita.runtime.counters import Counters
from plaita.runtime.inflight import InFlight, InFlightTable
from plaita.runtime.observer import Observers
from plaita.runtime.outcomes import ACK, DEAD, HANDBACK, RETRY, Done, Outcome, OutcomeRouter, _with_release
from plaita.store.leases import Lease
from plaita.tasks import Task


class Sink:
    """Records routed outcomes and whether each id was still in flight when it arrived."""

    def __init__(self, table: InFlightTable) -> None:
        self.table = table
        self.outcomes: list[Outcome] = []
        self.in_flight_on_arrival: list[bool] = []

    def put_many(self, outcomes: list[Outcome]) -> None:
        self.outcomes += outcomes
        self.in_flight_on_arrival += [o.message_id in self.table for o in outcomes]


class Setup:
    def __init__(self) -> None:
        self.table = InFlightTable()
        self.sink = Sink(self.table)
        self.counters = Counters(Observers())
        self.slot_freed = threading.Event()
        self.route = OutcomeRouter(
            inflight=self.table,
            settler=self.sink,
            counters=self.counters,
            observers=Observers(),
            slot_freed=self.slot_freed,
        )

    def read(self, message_id: str, *, lease: Lease | None = None, lost: bool = False) -> Task:
        task = Task(message_id, {"n": 1}, 1)
        self.table.add(InFlight(task, {"body": b'{"n": 1}', "extra": b"x"}, lease, lost=lost))
        return task


@pytest.fixture
def setup() -> Setup:
    return Setup()


def done(task: Task, outcome: Outcome) -> Done:
    return (task, outcome, 0.01)


def test_outcomes_reach_the_settler_before_leaving_the_in_flight_table(setup: Setup) -> None:
    a, b = setup.read("1-0"), setup.read("1-1")
    setup.route([done(a, Outcome("1-0")), done(b, Outcome("1-1", RETRY))])
    assert [o.message_id for o in setup.sink.outcomes] == ["1-0", "1-1"]
    assert setup.sink.in_flight_on_arrival == [True, True]
    assert len(setup.table) == 0
    assert setup.slot_freed.is_set()


def test_each_outcome_kind_is_counted(setup: Setup) -> None:
    tasks = [setup.read(f"1-{i}") for i in range(4)]
    setup.route(
        [
            done(tasks[0], Outcome("1-0")),
            done(tasks[1], Outcome("1-1", RETRY)),
            done(tasks[2], Outcome.to_dlq("1-2", "bad", 1, {})),
            done(tasks[3], Outcome("1-3", HANDBACK)),
        ]
    )
    c = setup.counters.snapshot()
    assert (c["completed"], c["failed"], c["dead_lettered"], c["handed_back"]) == (1, 2, 1, 1)


def test_a_lost_task_is_neither_settled_nor_counted(setup: Setup) -> None:
    lost = setup.read("1-0", lost=True)
    setup.route([done(lost, Outcome("1-0"))])
    assert setup.sink.outcomes == []
    assert setup.counters.completed == 0
    assert "1-0" not in setup.table


def test_the_lease_is_released_with_the_outcome(setup: Setup) -> None:
    task = setup.read("1-0", lease=Lease("e1", "lease:e1", "me:1", 3))
    setup.route([done(task, Outcome("1-0"))])
    assert setup.sink.outcomes[0].release == ("lease:e1", "me:1")


def test_attaching_a_release_copies_every_other_field() -> None:
    """``_with_release`` passes the fields one by one: a field added to Outcome must be too."""
    names = [f.name for f in dataclasses.fields(Outcome)]
    values = {name: f"value of {name}" for name in names}
    copy = _with_release(Outcome(**values), ("k", "v"))  # type: ignore[arg-type]
    assert {name: getattr(copy, name) for name in names} == {**values, "release": ("k", "v")}


def test_a_hand_back_carries_the_entry_fields_and_without_them_is_a_retry(setup: Setup) -> None:
    known = setup.read("1-0")
    unknown = Task("1-1", {}, 1)  # not in the table: its fields are unknown
    setup.route([done(known, Outcome("1-0", HANDBACK)), done(unknown, Outcome("1-1", HANDBACK))])
    first, second = setup.sink.outcomes
    assert (first.kind, first.fields) == (HANDBACK, {"body": b'{"n": 1}', "extra": b"x"})
    assert (second.kind, second.fields) == (RETRY, None)


def test_a_handlers_dead_letter_keeps_every_field_of_the_entry(setup: Setup) -> None:
    task = setup.read("1-0")
    setup.route([done(task, Outcome.to_dlq("1-0", "rejected", 1, {"n": 1}))])
    (out,) = setup.sink.outcomes
    assert out.kind == DEAD and out.dead is not None
    assert out.dead.fields == {"body": b'{"n": 1}', "extra": b"x"}
    assert out.dead.reason == "rejected"


def test_an_ack_stays_an_ack(setup: Setup) -> None:
    task = setup.read("1-0")
    setup.route([done(task, Outcome("1-0"))])
    assert setup.sink.outcomes == [Outcome("1-0", ACK)]


def test_a_bare_success_is_an_ack_with_its_lease_released(setup: Setup) -> None:
    """The pools report a handler that returned as None: the router builds its one Outcome."""
    plain, leased = setup.read("1-0"), setup.read("1-1", lease=Lease("e1", "lease:e1", "me:1", 3))
    unknown = Task("1-2", {}, 1)  # not in the table: acked, nothing to release
    lost = setup.read("1-3", lease=Lease("e2", "lease:e2", "me:2", 4), lost=True)
    setup.route([(plain, None, 0.01), (leased, None, 0.01), (unknown, None, 0.01), (lost, None, 0.01)])
    assert setup.sink.outcomes == [
        Outcome("1-0", ACK),
        Outcome("1-1", ACK, release=("lease:e1", "me:1")),
        Outcome("1-2", ACK),
    ]
    assert setup.counters.completed == 3
