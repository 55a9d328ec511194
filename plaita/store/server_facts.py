"""What a server says about itself: INFO and the CONFIG values ``plaita doctor`` judges.

Read once per server (every master of a cluster). A refusal is a fact, not a failure: a worker's
ACL user (``plaita.store.acl``) has no ``CONFIG`` (``CONFIG GET requirepass`` would show the
password), managed services rename or disable it, and a user without ``+info`` sees no INFO.
Each refused read is kept with its reason; a connection failure or timeout propagates.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import redis
from redis.cluster import RedisCluster

from plaita.store.client import LazyCluster, is_cluster

#: The configuration the checks need. INFO already shows ``maxmemory``, its policy and whether AOF
#: is on, so those are judged even without CONFIG; ``save`` and ``appendfsync`` are CONFIG only.
CONFIG_PARAMS = ("maxmemory-policy", "maxmemory", "appendonly", "appendfsync", "save")
#: Why a worker has no CONFIG values: it never asks, since its minimal ACL user may not (and a
#: denied command, even one plaita would shrug off, is an entry in the server's ACL LOG).
NOT_ASKED = "a worker reads INFO only; plaita doctor reads CONFIG"
#: Longest reason kept for a refused read (a server's error text can be long).
REASON_MAX_CHARS = 160


@dataclass(frozen=True)
class ServerFacts:
    """One server: its INFO (every default section, values as redis-py parses them), the CONFIG
    values it gave, and what it refused to show (``"INFO"`` or a parameter name → reason)."""

    node: str
    info: dict[str, Any] = field(default_factory=dict)
    config: dict[str, str] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)


def _reason(exc: redis.ResponseError) -> str:
    """Why a read was refused, in a few words: an ACL, or a command the server disabled or renamed."""
    text = (str(exc).splitlines() or [type(exc).__name__])[0][:REASON_MAX_CHARS]
    if isinstance(exc, redis.exceptions.NoPermissionError):
        return f"ACL: {text}"
    if "unknown command" in text.lower():
        return f"disabled or renamed on this server: {text}"
    return text


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def read_node(client: redis.Redis, node: str, *, ask_config: bool = True) -> ServerFacts:
    """INFO and (``ask_config``) ``CONFIG_PARAMS`` of the server behind ``client`` (one parameter per
    CONFIG GET: several in one call needs Redis 7, and the doctor must still say so to an older server)."""
    info: dict[str, Any] = {}
    config: dict[str, str] = {}
    refused: dict[str, str] = {}
    try:
        info = client.info()
    except redis.ResponseError as exc:
        refused["INFO"] = _reason(exc)
    for param in CONFIG_PARAMS:
        if not ask_config:
            refused[param] = NOT_ASKED
            continue
        try:
            reply = cast(dict[Any, Any], client.config_get(param))
        except redis.ResponseError as exc:
            refused[param] = _reason(exc)
            continue
        values = {_text(k): _text(v) for k, v in reply.items()}
        if param in values:
            config[param] = values[param]
    return ServerFacts(node, info, config, refused)


def read_servers(client: redis.Redis, *, ask_config: bool = True) -> list[ServerFacts]:
    """The facts of the server ``client`` talks to, or of every master of its cluster (named
    ``host:port``; a single server's node name is empty). A ``redis+cluster://`` client on a
    server that is no cluster raises ``redis.RedisError`` saying so."""
    if not is_cluster(client):
        return [read_node(client, "", ask_config=ask_config)]
    cluster = cast(RedisCluster, client.cluster() if isinstance(client, LazyCluster) else client)
    out = []
    for node in cluster.get_primaries():  # type: ignore[no-untyped-call]
        out.append(read_node(cluster.get_redis_connection(node), f"{node.host}:{node.port}", ask_config=ask_config))
    return out
