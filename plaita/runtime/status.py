"""The worker's self-description: the status file, the registry entry and the status reply."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

from plaita.config import host_label
from plaita.fsm import State
from plaita.version import __version__

if TYPE_CHECKING:
    from plaita.runtime.worker import Worker

#: Registry ``status`` for each lifecycle state (the original's vocabulary).
REGISTRY_STATUS = {
    State.INIT: "starting",
    State.ENSURE_GROUP: "running",
    State.RESUMING_OWN: "running",
    State.RECLAIMING: "running",
    State.READING: "running",
    State.BACKOFF: "running",
    State.PAUSED: "paused",
    State.STOPPING: "draining",
    State.STOPPED: "stopped",
}


def worker_status(worker: Worker) -> dict[str, Any]:
    """What the worker is doing now, as one JSON-ready dict."""
    state = worker.lifecycle.state
    counters = worker.tally.snapshot()
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
