"""The server-drawn SVG (lifecycle diagram, throughput chart) and the throughput arithmetic. Pure."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from plaita.dashboard import svg
from plaita.dashboard.monitor import Throughput
from plaita.fsm import State
from plaita.fsm.table import edges


def _parse(markup: object) -> ET.Element:
    return ET.fromstring(str(markup))


class TestLifecycleDiagram:
    def test_every_edge_of_the_table_is_drawn_once(self) -> None:
        root = _parse(svg.lifecycle_svg({}))
        drawn: set[tuple[str, str, str]] = set()
        for g in root.iter("g"):
            if "data-edge" in g.attrib:
                src, dest = g.attrib["data-edge"].split("->")
                label = "".join(g.itertext())
                drawn.update((src, t.split(" [")[0], dest) for t in label.split(", "))
            elif "data-fan-in" in g.attrib:
                trigger = g.attrib["data-trigger"].split(" [")[0]
                drawn.update((s, trigger, g.attrib["data-fan-in"]) for s in g.attrib["data-sources"].split())
        expected = {(src.name, trig, dest.name) for src, trig, dest, _cond in edges() if dest is not None}
        assert drawn == expected

    def test_each_state_is_a_box_and_workers_are_marked_on_theirs(self) -> None:
        root = _parse(svg.lifecycle_svg({"READING": ["w1", "w2", "w3"], "BACKOFF": ["w9"]}))
        boxes = {g.attrib["data-state"]: g for g in root.iter("g") if "data-state" in g.attrib}
        assert set(boxes) == {s.name for s in State}
        assert boxes["READING"].attrib["data-count"] == "3" and "marked" in boxes["READING"].attrib["class"]
        assert boxes["BACKOFF"].attrib["data-count"] == "1" and boxes["INIT"].attrib["data-count"] == "0"
        who = [t.text for t in boxes["READING"].iter("text") if t.attrib.get("class") == "who"]
        assert who == ["w1, w2 +1"]

    def test_instance_ids_are_escaped(self) -> None:
        markup = str(svg.lifecycle_svg({"READING": ['<img src=x onerror="alert(1)">']}))
        assert "<img" not in markup and "&lt;img" in markup
        _parse(markup)  # still well-formed

    def test_every_state_gets_its_own_place_even_one_the_layout_does_not_name(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        pos = svg.positions()
        assert set(pos) == set(State) and len(set(pos.values())) == len(State)
        monkeypatch.setattr(svg, "BELOW", {k: v for k, v in svg.BELOW.items() if k != "PAUSED"})
        monkeypatch.setattr(svg, "TOP_ROW", ("NOT_A_STATE", *svg.TOP_ROW))
        pos = svg.positions()
        assert set(pos) == set(State) and len(set(pos.values())) == len(State)
        assert pos[State.PAUSED][1] > max(svg.ROWS_Y), "an unplaced state goes to an extra row"


class TestThroughputChart:
    def test_a_gap_breaks_the_line_and_old_points_are_dropped(self) -> None:
        now = 1000.0
        points: list[tuple[float, float | None]] = [(500.0, 9.0), (900.0, 2.0), (910.0, 4.0), (920.0, None)]
        points += [(930.0, 1.0), (940.0, 3.0)]
        root = _parse(svg.throughput_svg(points, now, window_s=180.0))
        lines = [p.attrib["points"].split() for p in root.iter("polyline")]
        assert [len(line) for line in lines] == [2, 2], "the point outside the window is left out"
        assert root.attrib["data-top"] == "4.00", "scaled to the highest rate shown"


class TestThroughput:
    def test_rate_is_growth_between_a_workers_heartbeats_summed_over_workers(self) -> None:
        t = Throughput(window_s=60)
        assert t.observe(100.0, [{"instance_id": "a", "processed": 0, "last_heartbeat": 100.0}]) == 0.0
        a = {"instance_id": "a", "processed": 50, "last_heartbeat": 110.0}
        assert t.observe(111.0, [a]) == pytest.approx(5.0)
        assert t.observe(112.0, [a]) == pytest.approx(5.0), "no new heartbeat: the last rate holds"
        b0 = {"instance_id": "b", "processed": 7, "last_heartbeat": 110.0}
        b1 = {"instance_id": "b", "processed": 27, "last_heartbeat": 120.0}
        t.observe(113.0, [a, b0])
        assert t.observe(121.0, [a, b1]) == pytest.approx(7.0)
        close = {"instance_id": "b", "processed": 99, "last_heartbeat": 120.5}
        assert t.observe(122.0, [a, close]) == pytest.approx(7.0), "heartbeats under 1 s apart are not a rate"
        assert t.observe(123.0, [b1]) == pytest.approx(2.0), "a worker gone from the registry counts no more"

    def test_gaps_are_kept_and_history_is_bounded_by_the_window(self) -> None:
        t = Throughput(window_s=10)
        t.observe(100.0, [])
        t.gap(105.0)
        assert t.current() is None and list(t.points) == [(100.0, 0.0), (105.0, None)]
        t.observe(112.0, [])
        assert [p[0] for p in t.points] == [105.0, 112.0]


def test_a_young_dashboard_stretches_its_history_over_the_chart() -> None:
    from plaita.dashboard.monitor import MIN_SHOWN_S, _shown_window_s

    assert _shown_window_s([], 100.0, 180.0) == MIN_SHOWN_S
    assert _shown_window_s([(40.0, 1.0)], 100.0, 180.0) == 60.0
    assert _shown_window_s([(90.0, 1.0)], 100.0, 180.0) == MIN_SHOWN_S
    assert _shown_window_s([(0.0, 1.0)], 1000.0, 180.0) == 180.0
