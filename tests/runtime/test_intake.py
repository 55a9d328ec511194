"""The intake on its own: which read entries start, which go to the DLQ, which wait for a lease.

Leases come from a stand-in that answers as ``LeaseManager.acquire_many`` does (a ``Lease`` or
the holder's value); whether Redis grants them is the store's business, tested there.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from plaita.config import Settings
from plaita.runtime.counters import Counters
from plaita.runtime.inflight import InFlightTable
from plaita.runtime.intake import Intake
from plaita.runtime.observer import Observers
from plaita.runtime.outcomes import DEAD, Outcome
from plaita.store.keyspace import DEFAULT
from plaita.store.leases import Lease
from plaita.store.streams.entries import Entry
from plaita.tasks import Task

ME = "worker:me@host:1"


class Leases:
    """Grants every lease except those in ``held`` (holder value); ``fail`` makes the call raise."""

    keyspace = DEFAULT

    def __init__(self) -> None:
        self.held: dict[str, str] = {}
        self.fail = False
        self.fail_send = False
        self.released: list[str] = []
        self.asked: list[list[str]] = []

    def acquire_many(self, execution_ids: list[str], keyspaces: object = None) -> list[Lease | str]:
        self.asked.append(list(execution_ids))
        if self.fail:
            raise ConnectionError("redis down")
        granted: dict[str, Lease] = {}
        out: list[Lease | str] = []
        for e in execution_ids:  # as the script: a second task of one execution sees our value
            got = self.held.get(e) or (granted[e].value if e in granted else Lease(e, f"lease:{e}", f"{ME}:7", 7))
            if not isinstance(got, str):
                granted[e] = got
            out.append(got)
        return out

    def send_acquire_many(self, execution_ids: list[str], keyspaces: object = None) -> Sent:
        """As the store's: sent now, answered (or failed, with ``fail``) when the reply is read."""
        if self.fail_send:
            raise ConnectionError("redis down")
        return Sent(lambda: self.acquire_many(execution_ids, keyspaces))

    def ours(self, execution_id: str, value: str, keyspace: object = None) -> Lease | None:
        return Lease(execution_id, f"lease:{execution_id}", value, 7) if value.startswith(ME) else None

    def release_orphan(self, execution_id: str, keyspace: object = None) -> bool:
        self.released.append(execution_id)
        self.held.pop(execution_id, None)
        return True


class Sent:
    """A ``PendingAcquire`` stand-in: the reply is computed when read; ``abandon`` is recorded."""

    def __init__(self, reply: Callable[[], list[Lease | str]]) -> None:
        self.reply, self.abandoned = reply, False

    def result(self) -> list[Lease | str]:
        return self.reply()

    def abandon(self) -> None:
        self.abandoned = True


class Pool:
    mean_duration_s: float | None = None

    def __init__(self) -> None:
        self.submitted: list[Task] = []

    def submit(self, tasks: list[Task]) -> None:
        self.submitted += tasks


class Settler:
    def __init__(self) -> None:
        self.outcomes: list[Outcome] = []

    def put(self, outcome: Outcome) -> None:
        self.outcomes.append(outcome)

    def unsettled_ids(self) -> set[str]:
        return {o.message_id for o in self.outcomes}


class Setup:
    def __init__(self, **overrides: Any) -> None:
        self.settings = Settings(redis_url="redis://127.0.0.1:1", max_deliveries=3, concurrency=4, **overrides)
        self.inflight, self.pool, self.settler, self.leases = InFlightTable(), Pool(), Settler(), Leases()
        self.counters = Counters(Observers())
        self.intake = Intake(
            self.settings,
            inflight=self.inflight,
            pool=self.pool,  # type: ignore[arg-type]
            settler=self.settler,  # type: ignore[arg-type]
            leases=self.leases,  # type: ignore[arg-type]
            counters=self.counters,
        )

    def started(self) -> list[str]:
        return [t.message_id for t in self.pool.submitted]


def entry(message_id: str, body: dict[str, Any] | str, delivery_count: int = 1) -> Entry:
    """A stream entry as producers write it (a start task), or raw text for a bad one."""
    raw = body if isinstance(body, str) else json.dumps({"type": "start", "flow_id": "f", **body})
    return Entry(message_id, {"payload": raw.encode()}, delivery_count)


@pytest.fixture
def s() -> Setup:
    return Setup()


def test_a_task_of_an_execution_starts_with_its_lease_and_fencing_token(s: Setup) -> None:
    assert s.intake.accept([entry("1-0", {"execution_id": "e1"})]) == 1
    (task,) = s.pool.submitted
    assert task.fencing_token == 7 and task.keyspace is DEFAULT
    assert s.leases.asked == [["e1"]]
    assert s.counters.read == 1 and "1-0" in s.inflight


def test_a_plain_task_starts_without_asking_for_a_lease(s: Setup) -> None:
    assert s.intake.accept([entry("1-0", {"n": 1})]) == 1
    assert s.leases.asked == []  # its lease is taken lazily by the renewer if it runs long
    assert s.started() == ["1-0"]


def test_a_lease_held_elsewhere_leaves_the_task_pending_and_counts_a_conflict(s: Setup) -> None:
    s.leases.held["e1"] = "worker:other@host:1:3"
    assert s.intake.accept([entry("1-0", {"execution_id": "e1"}), entry("1-1", {"n": 2})]) == 1
    assert s.started() == ["1-1"]
    assert "1-0" not in s.inflight and s.settler.outcomes == []  # not acked: it waits for the lease
    assert s.counters.lease_conflicts == 1


def test_a_lease_key_of_another_type_counts_a_bad_key_and_logs_once(s: Setup, caplog: pytest.LogCaptureFixture) -> None:
    s.leases.held["e1"] = "!WRONGTYPE"
    s.intake.accept([entry("1-0", {"execution_id": "e1"})])
    s.intake.accept([entry("1-0", {"execution_id": "e1"}, 2)])
    assert s.counters.bad_keys == 2 and s.counters.lease_conflicts == 0
    assert caplog.text.count("is not a plaita lease") == 1
    assert s.started() == []


def test_our_own_orphan_lease_is_released_and_taken_again(s: Setup) -> None:
    s.leases.held["e1"] = f"{ME}:6"  # an earlier acquire whose reply was lost
    assert s.intake.accept([entry("1-0", {"execution_id": "e1"})]) == 1
    assert s.leases.released == ["e1"] and s.leases.asked == [["e1"], ["e1"]]


def test_a_second_task_of_an_execution_in_the_same_batch_waits_and_is_no_orphan(s: Setup) -> None:
    """Refused with our own value (the first task of the batch has the lease): a conflict."""
    assert s.intake.accept([entry("1-0", {"execution_id": "e1"}), entry("1-1", {"execution_id": "e1"})]) == 1
    assert s.started() == ["1-0"] and "1-1" not in s.inflight
    assert s.leases.released == [] and s.counters.lease_conflicts == 1


def test_a_failed_acquire_still_starts_the_plain_tasks_and_suspects_orphans(s: Setup) -> None:
    s.leases.fail = True
    with pytest.raises(ConnectionError):
        s.intake.accept([entry("1-0", {"execution_id": "e1"}), entry("1-1", {"n": 2})])
    assert s.started() == ["1-1"]
    assert s.inflight.take_orphan_suspects() == {"e1"}


def test_malformed_and_over_delivered_entries_go_to_the_dlq(s: Setup) -> None:
    accepted = s.intake.accept([entry("1-0", "{not json"), entry("1-1", {"n": 1}, delivery_count=4)])
    assert accepted == 0 and s.started() == []
    kinds = {o.message_id: (o.kind, o.dead.reason if o.dead else "") for o in s.settler.outcomes}
    assert kinds["1-0"][0] == DEAD and "JSON" in kinds["1-0"][1]
    assert kinds["1-1"] == (DEAD, "max_deliveries")
    assert s.counters.bad_input == 1 and s.counters.dead_lettered == 2


def test_a_deleted_entry_is_acked_and_one_already_running_is_skipped(s: Setup) -> None:
    s.intake.accept([entry("1-0", {"n": 1})])
    assert s.intake.accept([Entry("1-1", None), entry("1-0", {"n": 1}, 2)]) == 0
    assert s.settler.outcomes == [Outcome("1-1")]
    assert s.started() == ["1-0"]  # once


def test_free_slots_read_ahead_only_for_fast_handlers() -> None:
    s = Setup()
    assert s.intake.free_slots() == 4
    s.pool.mean_duration_s = 0.001
    assert s.intake.free_slots() > 4
    s.pool.mean_duration_s = 0.5
    assert s.intake.free_slots() == 4
    s.intake.accept([entry("1-0", {"n": 1})])
    assert s.intake.free_slots() == 3


def test_free_slots_count_tasks_read_but_not_yet_in_flight() -> None:
    s = Setup(prefetch=10)
    assert s.intake.free_slots() == 14
    assert s.intake.free_slots(unstarted=6) == 8


def test_a_parsed_batch_starts_its_plain_tasks_and_leases_the_rest_when_the_reply_is_read(s: Setup) -> None:
    batch = s.intake.parse_batch([entry("1-0", {"execution_id": "e1"}), entry("1-1", {"n": 2})])
    assert s.started() == ["1-1"] and "1-0" not in s.inflight and s.leases.asked == []
    s.intake.send_acquire(batch)
    assert s.started() == ["1-1"]  # the reply is not read yet
    assert s.intake.start_leased(batch) == 2
    assert s.started() == ["1-1", "1-0"] and "1-0" in s.inflight
    assert s.counters.read == 2


def test_a_failed_send_or_reply_suspects_orphans_and_starts_nothing_leased(s: Setup) -> None:
    s.leases.fail_send = True
    batch = s.intake.parse_batch([entry("1-0", {"execution_id": "e1"})])
    with pytest.raises(ConnectionError):
        s.intake.send_acquire(batch)
    assert s.inflight.take_orphan_suspects() == {"e1"}
    s.leases.fail_send, s.leases.fail = False, True
    batch = s.intake.parse_batch([entry("1-1", {"execution_id": "e2"})])
    s.intake.send_acquire(batch)
    with pytest.raises(ConnectionError):
        s.intake.start_leased(batch)
    assert s.inflight.take_orphan_suspects() == {"e2"} and s.started() == []


def test_a_dropped_batch_abandons_its_reply_and_suspects_orphans(s: Setup) -> None:
    batch = s.intake.parse_batch([entry("1-0", {"execution_id": "e1"})])
    s.intake.send_acquire(batch)
    sent = batch.acquire
    s.intake.drop(batch)
    assert isinstance(sent, Sent) and sent.abandoned
    assert s.inflight.take_orphan_suspects() == {"e1"} and s.started() == []
    assert "1-0" not in s.inflight and "1-0" not in s.intake.ours()  # its entry waits in the PEL
