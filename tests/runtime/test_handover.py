"""A task its handler cannot run here (``NotForThisWorker``): handed back, left, or dead-lettered."""

from __future__ import annotations

import time

import pytest

from plaita.errors import NotForThisWorker
from plaita.runtime.handover import not_for_this_worker
from plaita.runtime.outcomes import DEAD, HANDBACK, RETRY
from plaita.runtime.pool import judge
from plaita.tasks import Task


def task(delivery_count: int) -> Task:
    return Task("1-0", {"type": "start", "flow_id": "f"}, delivery_count)


def test_a_hand_back_waits_its_delay_and_is_not_charged_a_delivery() -> None:
    before = time.monotonic()
    out = not_for_this_worker(task(5), NotForThisWorker("needs flow v2", delay_s=2.0), max_deliveries=5)
    assert out.kind == HANDBACK and out.dead is None  # even on the last delivery: no charge
    assert before + 2.0 <= out.not_before_s <= time.monotonic() + 2.0


def test_a_negative_delay_hands_back_at_once() -> None:
    before = time.monotonic()
    out = not_for_this_worker(task(1), NotForThisWorker("x", delay_s=-5.0), max_deliveries=5)
    assert before <= out.not_before_s <= time.monotonic()


@pytest.mark.parametrize(("delivery", "kind"), [(1, RETRY), (4, RETRY), (5, DEAD), (6, DEAD)])
def test_past_the_hand_back_budget_it_is_a_failed_delivery(delivery: int, kind: str) -> None:
    out = not_for_this_worker(task(delivery), NotForThisWorker("no worker has v2", hand_back=False), 5)
    assert out.kind == kind
    if kind == DEAD:
        assert out.dead is not None and out.dead.reason == "no worker has v2"


def test_the_pools_judge_routes_it_here() -> None:
    out = judge(task(1), NotForThisWorker("x"), max_deliveries=5)
    assert out.kind == HANDBACK
