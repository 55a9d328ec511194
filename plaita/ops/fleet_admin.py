"""What the operator commands ask of a queue and its fleet: ``plaita workers | status | stop | pause
| resume | dlq`` open an ``Admin`` here and call its methods; they print, this module reads and sends.

``open_admin`` opens the queue the command names, with a door on the fleet's keys sharing its client
(``FleetAccess``); without ``--partitions`` it takes the count the queue's registered workers run
with. Redis failures pass through unchanged (the command reports them as one line); an operator's
mistake (an unknown instance, a worker that does not answer) raises ``FleetCommandError``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from plaita.config import Settings, TlsFiles
from plaita.errors import PlaitaError
from plaita.ops import fleetcheck
from plaita.store.client import make_client
from plaita.store.fleet import REPLY_PREFIX
from plaita.store.fleet_access import FleetAccess
from plaita.store.keyspace import Keyspace
from plaita.store.partitioned import open_queue
from plaita.store.queue_access import execution_counts_of, waiting_starts_of
from plaita.store.stats import stream_stats_or_empty
from plaita.store.streams.dlq import DeadLetterQueue
from plaita.store.streams.queue import StreamQueue


class FleetCommandError(PlaitaError):
    """An operator's mistake or an absent worker: the command says so (exit 1), no traceback."""


@dataclass(frozen=True)
class AdminTarget:
    """The queue an operator command names."""

    redis_url: str
    queue_name: str
    consumer_group: str
    dlq_key: str = ""
    tls: TlsFiles | None = None
    #: ``--partitions``; None: the count the queue's registered workers run with.
    partitions: int | None = 1


@dataclass(frozen=True)
class Admin:
    """An opened queue, the fleet's keys on its client, and where its partition count came from."""

    queue: StreamQueue
    fleet: FleetAccess
    partitions_from: str

    def workers(self) -> list[dict[str, Any]]:
        return self.fleet.workers()

    def dead_letters(self) -> DeadLetterQueue:
        return DeadLetterQueue(self.queue)

    def fleet_problems(self, workers: list[dict[str, Any]]) -> list[str]:
        """The problems of every queue the registered workers consume (with the count they use)."""
        out: list[str] = []
        for queue, group in sorted({(str(w.get("stream")), str(w.get("group"))) for w in workers}):
            members = fleetcheck.same_queue(workers, queue, group)
            n = max(fleetcheck.fleet_partitions(members) or {1})
            ks = Keyspace(queue, n, n > 1 or self.fleet.on_cluster())
            out += fleetcheck.problems(members, self.fleet.stray_streams(ks)[0], queue=queue, partitions=n)
        return out

    def queue_status(self) -> dict[str, Any]:
        """The queue's stream figures, problems, executions by status and starts waiting for a slot."""
        stats = stream_stats_or_empty(self.queue)
        stats["partitions_count"] = self.queue.keyspace.partitions
        stats["partitions_from"] = self.partitions_from
        stats["problems"] = fleetcheck.check(self.fleet, self.queue.keyspace, self.queue.group)
        stats["executions"] = execution_counts_of(self.queue)
        stats["starts_waiting_for_slot"] = waiting_starts_of(self.queue)
        return stats

    def resolve_instance(self, instance: str, warn: Callable[[str], None]) -> str:
        """The instance id ``instance`` names: itself when registered, else the worker registered with
        that consumer name, else one that listens on its channel though its entry expired (``warn``
        is told so)."""
        if self.fleet.is_registered(instance):
            return instance
        matches = [w for w in self.fleet.workers() if w.get("consumer") == instance]
        if matches:
            # A worker killed moments ago leaves its entry (until its TTL) under the consumer name
            # its restarted successor uses: address the one that listens, else the freshest.
            live = [w for w in matches if self.fleet.listeners(str(w["instance_id"]))]
            newest = max(live or matches, key=lambda w: float(w.get("last_heartbeat") or 0))
            return str(newest["instance_id"])
        if self.fleet.listeners(instance):
            # Its registry entry expired (say Redis refused the heartbeat's writes) but it listens.
            warn(f"{instance!r} is not in the registry (expired?) but listens on its channel")
            return instance
        raise FleetCommandError(f"unknown worker instance {instance!r} (see `plaita workers`)")

    def ask_status(self, instance: str, timeout_s: float) -> dict[str, Any]:
        """The status a registered worker answers with, waiting at most ``timeout_s``."""
        reply_to = f"{REPLY_PREFIX}{uuid.uuid4().hex}"
        received = self.fleet.send_command(instance, "status", reply_to=reply_to, request_id=reply_to)
        if received == 0:
            raise FleetCommandError(f"worker {instance!r} is registered but not listening (stopping or cut off?)")
        answer = self.fleet.wait_reply(reply_to, timeout_s)
        if answer is None:
            raise FleetCommandError(f"worker {instance!r} did not answer within {timeout_s:.0f} s")
        return cast(dict[str, Any], answer["status"])

    def send(self, target: str, command: str, *, now: bool) -> int:
        """Publish ``command`` to ``target`` (an instance id or ``all``); how many workers received it."""
        received = self.fleet.send_command(target, command, now=now)
        if received == 0:
            raise FleetCommandError(f"no worker is listening on the control channel for {target!r}")
        return received


def open_admin(target: AdminTarget, *, socket_timeout_s: float) -> Admin:
    """Open the queue ``target`` names (connected lazily: a Redis failure comes with the first call)."""
    client = make_client(target.redis_url, socket_timeout_s=socket_timeout_s, tls=target.tls)
    fleet = FleetAccess(client)
    partitions, partitions_from = (1 if target.partitions is None else target.partitions), "--partitions"
    if target.partitions is None:
        counts = fleetcheck.fleet_partitions(
            fleetcheck.same_queue(fleet.workers(), target.queue_name, target.consumer_group)
        )
        partitions, partitions_from = 1, "default (no worker registered)"
        if counts:
            partitions = max(counts)  # on a mismatch the problems say so; the larger count shows more
            partitions_from = "the registered workers'" if len(counts) == 1 else "the largest of the workers'"
    settings = Settings(
        redis_url=target.redis_url,
        queue_name=target.queue_name,
        consumer_group=target.consumer_group,
        consumer_name="plaita-admin",
        dlq_key=target.dlq_key,
        partitions=partitions,
    )
    return Admin(open_queue(settings, client=client), fleet, partitions_from)
