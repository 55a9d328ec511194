"""The worker's self-description on its own: every state has a registry word, the counters show."""

from __future__ import annotations

from typing import Any

import redis

from plaita.config import Settings
from plaita.fsm import Lifecycle, State
from plaita.runtime.counters import Counters
from plaita.runtime.observer import Observers
from plaita.runtime.outage import Outage
from plaita.runtime.status import REGISTRY_STATUS, worker_status


def test_every_state_has_one_of_the_five_registry_words() -> None:
    assert set(REGISTRY_STATUS) == set(State)
    assert set(REGISTRY_STATUS.values()) == {"starting", "running", "paused", "draining", "stopped"}


class Backlog:
    backlog = 3


class Described:
    """What ``worker_status`` reads, set by hand (a ``Describable``)."""

    def __init__(self) -> None:
        self.instance_id = "host-1234abcd"
        self.settings = Settings(redis_url="redis://127.0.0.1:1", consumer_name="c1", partitions=2)
        self.lifecycle = Lifecycle(initial=State.PAUSED)
        self.observers = Observers()
        self.counters = Counters(self.observers)
        self.outage = Outage()
        self.settler = Backlog()
        self.runs: dict[str, Any] = {"handler": "m:f"}
        self.in_flight = 2

    def readiness(self) -> tuple[bool, str]:
        return False, "paused by remote command"


def test_the_status_reports_state_counters_backlog_and_the_last_error() -> None:
    w = Described()
    w.counters.add("completed", 5)
    w.counters.add("failed", 2)
    w.counters.add("dead_lettered", 1)
    w.outage.record(redis.ConnectionError("refused"), "read")
    status = worker_status(w)  # type: ignore[arg-type]
    assert (status["state"], status["status"]) == ("PAUSED", "paused")
    assert (status["ready"], status["ready_reason"]) == (False, "paused by remote command")
    assert (status["processed"], status["failed"], status["dead_lettered"]) == (5, 2, 1)
    assert status["counters"]["completed"] == 5
    assert (status["in_flight"], status["unsettled"]) == (2, 3)
    assert status["last_error"] == "ConnectionError: refused"
    assert (status["consumer"], status["partitions"], status["runs"]) == ("c1", 2, {"handler": "m:f"})
