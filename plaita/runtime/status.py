"""The worker's self-description: the status file, the registry entry and the status reply."""

from __future__ import annotations

import os
import time
from typing import Any, Protocol

from plaita.config import Settings, host_label
from plaita.fsm import Lifecycle, State
from plaita.runtime.counters import Counters
from plaita.runtime.observer import Observers
from plaita.runtime.outage import Outage
from plaita.runtime.settler import Settler
from plaita.version import __version__

#: Registry ``status`` for each lifecycle state: the five words fleet tools read in registry
#: entries (a promise: they do not change with the states).
REGISTRY_STATUS = {
    State.INIT: "starting",
    State.ENSURE_GROUP: "running",
    State.RESUMING_OWN: "running",
    State.RECLAIMING: "running",
    State.ISOLATING: "running",
    State.READING: "running",
    State.BACKOFF: "running",
    State.PAUSED: "paused",
    State.STOPPING: "draining",
    State.STOPPED: "stopped",
}


class Describable(Protocol):
    """What the status reads of a worker (the ``Worker``; a protocol so this module need not
    import the worker that calls it)."""

    instance_id: str
    settings: Settings
    lifecycle: Lifecycle
    counters: Counters
    outage: Outage
    observers: Observers
    settler: Settler
    runs: dict[str, Any]

    @property
    def in_flight(self) -> int: ...
    def readiness(self) -> tuple[bool, str]: ...


def worker_status(worker: Describable) -> dict[str, Any]:
    """What the worker is doing now, as one JSON-ready dict."""
    state = worker.lifecycle.state
    counters = worker.counters.snapshot()
    ready, reason = worker.readiness()
    in_state_s = worker.lifecycle.seconds_in_state()
    last = worker.outage.last
    return {
        "instance_id": worker.instance_id,
        "service_type": "flow_worker",
        "host": host_label(),
        "pid": os.getpid(),
        "version": __version__,
        "consumer": worker.settings.consumer_name,
        "stream": worker.settings.queue_name,
        "group": worker.settings.consumer_group,
        # The fleet checks compare these across workers (plaita.ops.fleetcheck).
        "partitions": worker.settings.partitions,
        "partitions_assigned": list(worker.settings.partitions_assigned or ()) or None,
        "runs": worker.runs,
        "status": REGISTRY_STATUS[state],
        "state": state.name,
        "state_since": round(time.time() - in_state_s, 3),
        "state_for_s": round(in_state_s, 3),
        "ready": ready,
        "ready_reason": reason,
        "in_flight": worker.in_flight,
        "executions_in_flight": worker.observers.executions_in_flight,
        "unsettled": worker.settler.backlog,
        "processed": counters["completed"],
        "failed": counters["failed"],
        "dead_lettered": counters["dead_lettered"],
        "last_error": last.text if last is not None else None,
        "counters": counters,
        "time": time.time(),
    }
