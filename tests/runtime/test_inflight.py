"""The in-flight table on its own: settling marks, abandoning, orphan-lease suspects."""

from __future__ import annotations

from plaita.runtime.inflight import InFlight, InFlightTable
from plaita.tasks import Task


def item(message_id: str, execution_id: str | None = None, *, lost: bool = False) -> InFlight:
    body = {"execution_id": execution_id} if execution_id else {}
    return InFlight(Task(message_id, body, 1), {}, lost=lost)


def test_abandon_all_cancels_and_marks_lost_only_the_live_ones() -> None:
    table = InFlightTable()
    live, gone = item("1-0"), item("1-1", lost=True)
    table.add(live)
    table.add(gone)
    assert table.abandon_all() == [live]
    assert live.lost and live.task.cancelled.is_set()
    assert not gone.task.cancelled.is_set()  # its loss was handled when it was lost
    assert table.live() == [] and len(table) == 2  # still in the table until settled or handed back


def test_begin_settling_marks_known_ids_and_keeps_the_order() -> None:
    table = InFlightTable()
    a, b = item("1-0"), item("1-1")
    table.add(a)
    table.add(b)
    assert table.begin_settling(["1-1", "9-9", "1-0"]) == [b, None, a]
    assert a.settling and b.settling
    assert table.pop(["1-0", "9-9"]) == [a] and table.ids() == {"1-1"}


def test_orphan_suspects_wait_while_a_task_of_theirs_is_in_flight() -> None:
    table = InFlightTable()
    running = item("1-0", "busy")
    table.add(running)
    table.suspect_orphans(["busy", "idle"])
    assert table.runs_execution("busy") and not table.runs_execution("idle")
    assert table.take_orphan_suspects() == {"idle"}
    assert table.take_orphan_suspects() == set()  # taken once
    table.pop(["1-0"])
    assert table.take_orphan_suspects() == {"busy"}
