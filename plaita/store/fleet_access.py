"""The fleet's side of Redis behind one door: what ops/, cli/ and the dashboard call instead of
holding a raw client.

``FleetAccess`` wraps one client and offers the fleet-wide keys and servers as methods: the
registry entries, the control channels and their reply lists (``plaita.store.fleet`` builds the
keys and messages), the fleet check's shared result and stray partition streams, and the servers'
INFO/CONFIG. Nothing in it is execution-scoped; that is ``ExecutionStore``'s. Every method lets
redis-py exceptions through, as the functions it calls do: the caller decides what a failure means.
"""

from __future__ import annotations

from typing import Any

from plaita.config import TlsFiles
from plaita.store import fleet
from plaita.store.client import Client, is_cluster, make_client
from plaita.store.keyspace import Keyspace
from plaita.store.server_facts import ServerFacts, read_servers
from plaita.store.stats import stray_streams
from plaita.store.streams.queue import StreamQueue


class FleetAccess:
    """The registry, the control channels, the fleet check's keys and the servers, through one client."""

    def __init__(self, client: Client) -> None:
        self._client = client

    @classmethod
    def connect(
        cls, url: str, *, socket_timeout_s: float, client_name: str | None = None, tls: TlsFiles | None = None
    ) -> FleetAccess:
        """A door on a client of its own (connected lazily: never raises for Redis down)."""
        return cls(make_client(url, socket_timeout_s=socket_timeout_s, client_name=client_name, tls=tls))

    @classmethod
    def of(cls, queue: StreamQueue) -> FleetAccess:
        """A door sharing ``queue``'s client (closing the queue closes it)."""
        return cls(queue.client)

    def close(self) -> None:
        self._client.close()

    def on_cluster(self) -> bool:
        """Whether the client talks to a Redis Cluster (a keyspace there always carries hash tags)."""
        return is_cluster(self._client)

    # -- registry ----------------------------------------------------------------------
    def write_entry(self, instance_id: str, entry: dict[str, Any], ttl_s: float) -> None:
        fleet.write_entry(self._client, instance_id, entry, ttl_s)

    def delete_entry(self, instance_id: str) -> None:
        fleet.delete_entry(self._client, instance_id)

    def is_registered(self, instance_id: str) -> bool:
        return fleet.is_registered(self._client, instance_id)

    def workers(self) -> list[dict[str, Any]]:
        """Every registry entry, sorted by instance id."""
        return fleet.list_workers(self._client)

    # -- control channels --------------------------------------------------------------
    def listeners(self, instance_id: str) -> int:
        return fleet.listeners(self._client, instance_id)

    def send_command(
        self,
        target: str,
        command: str,
        *,
        now: bool = False,
        reply_to: str | None = None,
        request_id: str | None = None,
    ) -> int:
        """Publish ``command`` to one instance (or ``all``); how many workers received it."""
        return fleet.send_command(self._client, target, command, now=now, reply_to=reply_to, request_id=request_id)

    def push_reply(self, reply_to: str, answer: dict[str, Any]) -> None:
        fleet.push_reply(self._client, reply_to, answer)

    def wait_reply(self, reply_to: str, timeout_s: float) -> dict[str, Any] | None:
        return fleet.wait_reply(self._client, reply_to, timeout_s)

    def open_pubsub(self) -> Any:
        return fleet.open_pubsub(self._client)

    # -- fleet check -------------------------------------------------------------------
    def shared_problems(self, key: str) -> list[str] | None:
        return fleet.shared_problems(self._client, key)

    def share_problems(self, key: str, problems: list[str], ttl_s: float) -> None:
        fleet.share_problems(self._client, key, problems, ttl_s)

    def stray_streams(self, ks: Keyspace) -> tuple[dict[str, int], bool]:
        """Non-empty partition streams of ``ks.queue`` beyond ``ks.partitions``, and whether the scan was whole."""
        return stray_streams(self._client, ks)

    # -- servers -----------------------------------------------------------------------
    def servers(self, *, ask_config: bool = True) -> list[ServerFacts]:
        """INFO (and with ``ask_config`` CONFIG) of the server, or of every master of a cluster."""
        return read_servers(self._client, ask_config=ask_config)
