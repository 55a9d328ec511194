"""The fleet's Redis keys: registry entries, the control channels and their reply lists.

``plaita:registry:flow_worker:{instance}`` is a TTL'd JSON string per worker (fleet tools
read it: its name does not change); ``plaita:control:{instance}`` and ``plaita:control:all`` are
pub/sub channels carrying JSON commands; a command may name a reply list that the worker pushes
its answer to. Every function lets redis-py exceptions through: the caller decides what a failure means.
"""

from __future__ import annotations

import json
import time
from typing import Any

import redis

from plaita.store.client import get_many, is_cluster

#: Key prefix of registry entries (fleet tools read it: it does not change).
REGISTRY_PREFIX = "plaita:registry:flow_worker:"
#: Channel prefix; the per-instance channel is this plus the instance id.
CONTROL_PREFIX = "plaita:control:"
#: Channel every worker listens to.
CONTROL_ALL = "plaita:control:all"
#: Key prefix of the fleet check's shared result (``fleet_check_key``); v1: its JSON is a list of lines.
FLEETCHECK_PREFIX = "plaita:fleetcheck:v1:"
#: Prefix of the lists a worker pushes command replies to.
REPLY_PREFIX = "plaita:control:reply:"
#: Reply lists expire after this many seconds if nobody reads them.
REPLY_TTL_S = 60
#: Prefix of the per-task hand-over counters: they bound how often a task bounces between workers.
HANDOVER_PREFIX = "plaita:handover:"


def registry_key(instance_id: str) -> str:
    return f"{REGISTRY_PREFIX}{instance_id}"


def control_channel(instance_id: str) -> str:
    return f"{CONTROL_PREFIX}{instance_id}"


def write_entry(client: redis.Redis, instance_id: str, entry: dict[str, Any], ttl_s: float) -> None:
    """(Re)write one worker's registry entry with its TTL."""
    client.set(registry_key(instance_id), json.dumps(entry), px=max(1, int(ttl_s * 1000)))


def delete_entry(client: redis.Redis, instance_id: str) -> None:
    client.delete(registry_key(instance_id))


def is_registered(client: redis.Redis, instance_id: str) -> bool:
    return bool(client.exists(registry_key(instance_id)))


def list_workers(client: redis.Redis) -> list[dict[str, Any]]:
    """Every registry entry, sorted by instance id (SCAN, never KEYS)."""
    keys = sorted(client.scan_iter(match=f"{REGISTRY_PREFIX}*", count=500))
    if not keys:
        return []
    entries = []
    for key, raw in zip(keys, get_many(client, keys), strict=True):
        if raw is None:
            continue
        try:
            entry = json.loads(raw)
        except ValueError:
            continue
        if isinstance(entry, dict):
            name = key.decode() if isinstance(key, bytes) else str(key)
            entry.setdefault("instance_id", name[len(REGISTRY_PREFIX) :])
            entries.append(entry)
    return entries


def fleet_check_key(queue: str, group: str, partitions: int, kind: str) -> str:
    """Where the workers of one queue, group, ``--partitions`` and kind (``handler``/``flows``)
    share their last fleet check (all of them would find the same problems)."""
    return f"{FLEETCHECK_PREFIX}{kind}:{partitions}:{group}:{queue}"


def shared_problems(client: redis.Redis, key: str) -> list[str] | None:
    """The problems a worker of the fleet found within its check interval, or None (none shared
    yet, expired, or not a list of lines: then check alone)."""
    raw = client.get(key)
    if raw is None:
        return None
    try:
        found = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(found, list) or not all(isinstance(line, str) for line in found):
        return None
    return found


def share_problems(client: redis.Redis, key: str, problems: list[str], ttl_s: float) -> None:
    """Share a check's problems for ``ttl_s``: the other workers use them instead of scanning."""
    client.set(key, json.dumps(problems), px=max(1, int(ttl_s * 1000)))


def count_handover(client: redis.Redis, name: str, window_s: float) -> int:
    """Count one hand-over of task ``name``; how many there were in its ``window_s`` window
    (the window starts at the first one; the counter then expires)."""
    key = f"{HANDOVER_PREFIX}{name}"
    pipe = client.pipeline(transaction=False)  # one key: in order on one connection, any server
    pipe.set(key, 0, px=max(1, int(window_s * 1000)), nx=True)
    pipe.incr(key)
    return int(pipe.execute()[1])


def listeners(client: redis.Redis, instance_id: str) -> int:
    """How many workers are subscribed to ``instance_id``'s control channel (PUBSUB NUMSUB)."""
    return _subscribers(client, control_channel(instance_id))


def _subscribers(client: redis.Redis, channel: str) -> int:
    """Subscribers of ``channel``. On a cluster each node knows only its own (a message reaches
    them all: PUBLISH is broadcast over the cluster bus), so every node is asked."""
    if not is_cluster(client):
        counts = client.pubsub_numsub(channel)
        return int(counts[0][1]) if counts else 0
    total = 0
    for node in client.get_nodes():  # type: ignore[attr-defined]
        reply = client.execute_command("PUBSUB NUMSUB", channel, target_nodes=node)  # type: ignore[no-untyped-call]
        total += int(reply[0][1]) if reply else 0
    return total


def send_command(
    client: redis.Redis,
    target: str,
    command: str,
    *,
    now: bool = False,
    reply_to: str | None = None,
    request_id: str | None = None,
) -> int:
    """Publish ``command`` to one instance (or ``all``); returns how many workers received it."""
    channel = CONTROL_ALL if target == "all" else control_channel(target)
    message: dict[str, Any] = {"command": command, "now": now, "graceful": not now, "timestamp": time.time()}
    if reply_to:
        message["reply_to"] = reply_to
        message["request_id"] = request_id
    received = int(client.publish(channel, json.dumps(message)))
    # On a cluster PUBLISH counts the subscribers of one node only: count them all instead.
    return _subscribers(client, channel) if is_cluster(client) else received


def push_reply(client: redis.Redis, reply_to: str, answer: dict[str, Any]) -> None:
    """Push a command's answer to its reply list (expires if nobody reads it)."""
    pipe = client.pipeline(transaction=True)
    pipe.rpush(reply_to, json.dumps(answer))
    pipe.expire(reply_to, REPLY_TTL_S)
    pipe.execute()


def wait_reply(client: redis.Redis, reply_to: str, timeout_s: float) -> dict[str, Any] | None:
    """The first answer pushed to ``reply_to`` within ``timeout_s``, else None."""
    answer = client.blpop([reply_to], timeout=timeout_s)
    if answer is None:
        return None
    decoded = json.loads(answer[1])
    return decoded if isinstance(decoded, dict) else None


def open_pubsub(client: redis.Redis) -> Any:
    """A pub/sub object that reports subscribe confirmations (the listener waits for them)."""
    pubsub: Any = client.pubsub  # typed in some redis-py releases, not in others
    return pubsub(ignore_subscribe_messages=False)


class FleetView:
    """The registry as a flow runner's hand-over reads it: live workers, hand-over counts."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client

    def workers(self) -> list[dict[str, Any]]:
        return list_workers(self._client)

    def count_handover(self, name: str, window_s: float) -> int:
        return count_handover(self._client, name, window_s)
