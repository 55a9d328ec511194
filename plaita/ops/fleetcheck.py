"""Fleet misconfigurations that strand or steal tasks in silence, found from the registry and the keys.

* **Partition mismatch**: workers of one queue with different ``--partitions``, or non-empty
  partition streams that no worker with this ``--partitions`` reads (a producer with another
  count routed tasks there: they wait forever).
* **Handler and flow workers on one queue**: each takes the other's tasks (a handler acks a
  flow's start; a flow worker dead-letters a plain task).

A worker checks every ``CHECK_EVERY_S`` (one error line per problem each time, so once a minute)
and is not ready while a problem lasts; ``plaita status`` and ``plaita workers`` print the same
lines. Every check is best effort: a Redis failure skips it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from plaita.store.fleet import fleet_check_key
from plaita.store.fleet_access import FleetAccess
from plaita.store.keyspace import Keyspace

logger = logging.getLogger(__name__)
T = TypeVar("T")

#: Seconds between two checks of a worker (and so between two error lines about one problem).
CHECK_EVERY_S = 60.0


def same_queue(workers: list[dict[str, Any]], queue: str, group: str) -> list[dict[str, Any]]:
    """The registry entries of workers consuming ``queue`` with ``group``."""
    return [w for w in workers if w.get("stream") == queue and w.get("group") == group]


def fleet_partitions(workers: list[dict[str, Any]]) -> set[int]:
    """The ``--partitions`` the given workers run with (entries without one are not counted)."""
    return {int(w["partitions"]) for w in workers if isinstance(w.get("partitions"), int)}


def _names(workers: list[dict[str, Any]]) -> str:
    names = sorted(str(w.get("instance_id")) for w in workers)
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def problems(workers: list[dict[str, Any]], strays: dict[str, int], *, queue: str, partitions: int) -> list[str]:
    """One line per problem of the workers of one queue (``workers`` already filtered to it)."""
    out: list[str] = []
    counts = fleet_partitions(workers) | {partitions}
    if len(counts) > 1:
        by_count = {n: [w for w in workers if w.get("partitions") == n] for n in sorted(counts)}
        detail = "; ".join(f"--partitions {n}: {_names(ws) or 'this one'}" for n, ws in by_count.items())
        out.append(
            f"partition mismatch on queue {queue}: workers run with different --partitions ({detail}); tasks "
            "routed for one count wait in streams the others never read: give every producer and worker the same"
        )
    if strays:
        listed = ", ".join(f"{name} ({n})" for name, n in list(strays.items())[:6])
        out.append(
            f"partition mismatch on queue {queue}: {sum(strays.values())} task(s) wait in stream(s) no worker "
            f"with --partitions {partitions} reads: {listed}; a producer or worker uses another --partitions"
        )
    handlers = [w for w in workers if isinstance(w.get("runs"), dict) and "handler" in w["runs"]]
    flows = [w for w in workers if isinstance(w.get("runs"), dict) and "flows" in w["runs"]]
    if handlers and flows:
        kinds = sorted({str(w["runs"]["handler"]) for w in handlers})
        out.append(
            f"queue {queue} is shared by handler workers ({_names(handlers)}: {', '.join(kinds[:3])}) and flow "
            f"workers ({_names(flows)}): each takes the other's tasks; give them separate --queue-name"
        )
    return out


def check(fleet: FleetAccess, ks: Keyspace, group: str, me: dict[str, Any] | None = None) -> list[str]:
    """The problems of queue ``ks.queue`` seen from a worker (``me``: its own entry, counted even
    when it is not registered) or an operator with ``ks.partitions`` partitions."""
    workers = same_queue(fleet.workers(), ks.queue, group)
    if me is not None and all(w.get("instance_id") != me.get("instance_id") for w in workers):
        workers.append(me)
    strays, _complete = fleet.stray_streams(ks)
    return problems(workers, strays, queue=ks.queue, partitions=ks.partitions)


class FleetCheck:
    """A worker's periodic check: logs each problem at error level, keeps the readiness reason."""

    def __init__(
        self,
        fleet: FleetAccess,
        ks: Keyspace,
        group: str,
        *,
        me: Callable[[], dict[str, Any]],
        on_change: Callable[[str | None], None],
        every_s: float = CHECK_EVERY_S,
        share: bool = True,
    ) -> None:
        self.fleet = fleet
        #: Use and share the fleet's last result (``plaita:fleetcheck:v1:…``) instead of every
        #: worker scanning the keyspace each interval. Off for a worker that is not registered:
        #: the others' results cannot count it.
        self.share = share
        self.ks = ks
        self.group = group
        self._me = me
        self._on_change = on_change
        self.every_s = every_s
        self._next_at_s = 0.0
        self._lock = threading.Lock()
        self.problems: list[str] = []

    def due(self) -> bool:
        return time.monotonic() >= self._next_at_s

    def run(self) -> list[str]:
        """Check now (best effort): log every problem, report the readiness reason."""
        with self._lock:
            self._next_at_s = time.monotonic() + self.every_s
            try:
                found = self._find()
            except Exception as exc:  # a Redis failure: the worker's own loop reports outages
                logger.debug("fleet check skipped: %s: %s", type(exc).__name__, exc)
                return self.problems
            for line in found:
                logger.error("%s", line)
            if not found and self.problems:
                logger.info("fleet check: the misconfiguration reported earlier is gone")
            self.problems = found
            self._on_change("; ".join(found) if found else None)
            return found

    def _find(self) -> list[str]:
        """The fleet's problems: those a worker like this one (same queue, group, partitions and
        kind) shared within the interval, else checked here and shared. The check SCANs the
        keyspace (registry entries, stray partition streams): once per interval per fleet, not
        per worker."""
        me = self._me()
        key = fleet_check_key(self.ks.queue, self.group, self.ks.partitions, _kind(me)) if self.share else None
        if key is not None:
            shared = _best_effort(lambda: self.fleet.shared_problems(key))
            if shared is not None:
                return shared
        found = check(self.fleet, self.ks, self.group, me)
        if key is not None:
            _best_effort(lambda: self.fleet.share_problems(key, found, self.every_s))
        return found


def _kind(entry: dict[str, Any]) -> str:
    runs = entry.get("runs")
    return "flows" if isinstance(runs, dict) and "flows" in runs else "handler"


def _best_effort(call: Callable[[], T]) -> T | None:
    """Sharing only saves work: a refusal (an ACL without that key, another type there) means
    checking alone, never skipping the check."""
    try:
        return call()
    except Exception as exc:
        logger.debug("fleet check result not shared: %s: %s", type(exc).__name__, exc)
        return None
