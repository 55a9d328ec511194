"""Client construction: every redis-py client plaita uses is built here.

A worker's client has no hidden retries (a frozen server costs one socket timeout, not ten:
retrying is the lifecycle's job), TCP keepalive, and bounded connect and read timeouts.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any, cast

import hiredis
import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, NodesManager, RedisCluster
from redis.connection import HiredisRespSerializer
from redis.exceptions import RedisClusterException
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelConnectionPool
from redis.utils import HIREDIS_AVAILABLE

from plaita.config import (
    SENTINEL_SCHEME,
    ClusterTarget,
    SentinelTarget,
    Settings,
    TlsFiles,
    is_cluster_url,
    parse_cluster_url,
    parse_sentinel_url,
)
from plaita.errors import PlaitaError
from plaita.store import resp

#: Seconds to wait for a TCP connection before counting the attempt as a transient failure.
CONNECT_TIMEOUT_S = 2.0

#: The client type the rest of plaita passes around (so it need not import redis itself).
Client = redis.Redis


class NotAClusterError(PlaitaError, redis.RedisError):
    """A ``redis+cluster://`` URL names a server that is no cluster: waiting will not help."""


#: Commands of at least this many arguments try ``resp.pack_text`` first (an ack batch, a leased
#: read batch's acquire, its release): below it hiredis is as cheap.
PACK_TEXT_MIN_ARGS = 8


class _Packer(HiredisRespSerializer):
    """redis-py's hiredis packer without its per-argument generator.

    redis-py's ``pack`` rebuilds the argument tuple through a generator to turn bytearray and
    memoryview arguments into bytes, once per argument: for an ack batch (XACK and XDEL, each with
    every id) that generator cost as much as the packing itself. hiredis packs str, bytes, int
    and float as they are and refuses anything else with TypeError, so those go the generic way
    (converted there, or refused with redis-py's DataError): the bytes sent are the same.
    """

    def pack(self, *args: Any) -> list[bytes]:
        first = args[0]
        if len(args) >= PACK_TEXT_MIN_ARGS and isinstance(first, str) and " " not in first:
            packed = resp.pack_text(args)
            if packed is not None:
                return [packed]
        if isinstance(first, str):
            args = (*first.encode().split(), *args[1:])
        elif b" " in first:
            args = (*first.split(), *args[1:])
        try:
            return [hiredis.pack_command(args)]
        except TypeError:
            return cast(list[bytes], super().pack(*args))


#: Only where redis-py packs with hiredis itself (an older hiredis leaves it the pure-Python packer).
#: Built through Any: redis-py's packer __init__ is typed in some releases and not in others.
_PACKER: _Packer | None = cast(Any, _Packer)() if HIREDIS_AVAILABLE else None


def make_client(
    url: str, *, socket_timeout_s: float, client_name: str | None = None, tls: TlsFiles | None = None
) -> redis.Redis:
    """A redis-py client tuned for a worker: no hidden retries, keepalive, bounded timeouts.

    ``tls`` names the CA bundle and client certificate for a ``rediss://`` URL. redis-py reads
    them on every new connection, so an operator who replaces a wrong CA file is picked up at
    the next reconnect, without a restart.
    """
    options: dict[str, Any] = {
        "socket_timeout": socket_timeout_s,
        "socket_connect_timeout": CONNECT_TIMEOUT_S,
        "socket_keepalive": True,
        "retry": Retry(NoBackoff(), 0),
        "client_name": client_name,
        "decode_responses": False,
    }
    if tls is not None and url.startswith("rediss://"):
        tls_options = {"ssl_ca_certs": tls.ca_file, "ssl_certfile": tls.cert_file, "ssl_keyfile": tls.key_file}
        options.update({k: v for k, v in tls_options.items() if v is not None})
    if is_cluster_url(url):
        return _cluster_client(parse_cluster_url(url), options, tls)
    if url.startswith(f"{SENTINEL_SCHEME}://"):
        return _sentinel_client(parse_sentinel_url(url), options)
    if _PACKER is not None:
        options["command_packer"] = _PACKER  # stateless: one for every connection
    return redis.Redis.from_url(url, **options)


class LazyCluster:
    """A ``RedisCluster`` built at its first use.

    redis-py's constructor asks a startup node for the slot map at once, so a worker started
    while the cluster is down would fail before its lifecycle runs. Built lazily, that first
    failure is a ConnectionError inside the lifecycle: BACKOFF, like any other outage. MOVED and
    ASK are followed by the client; a connection error makes it reload the slot map, so after a
    failover inside the cluster the next call finds the promoted replica.
    """

    def __init__(self, factory: Callable[[], RedisCluster], describe: str) -> None:
        self._factory = factory
        self._describe = describe
        self._cluster: RedisCluster | None = None
        self._lock = threading.Lock()
        self._callbacks: dict[str, Callable[..., Any]] = {}

    def set_response_callback(self, command: str, callback: Callable[..., Any]) -> None:
        """Kept until the cluster client exists (setting it must not connect)."""
        with self._lock:
            self._callbacks[command] = callback
            if self._cluster is not None:
                self._cluster.set_response_callback(command, callback)  # type: ignore[no-untyped-call]

    def cluster(self) -> RedisCluster:
        with self._lock:
            if self._cluster is None:
                self._cluster = self._build()
            return self._cluster

    def _build(self) -> RedisCluster:
        try:
            cluster = self._factory()
            for command, callback in self._callbacks.items():
                cluster.set_response_callback(command, callback)  # type: ignore[no-untyped-call]
            return cluster
        except Exception as exc:
            _close_half_built(exc)
            if not isinstance(exc, RedisClusterException):
                raise
            if "not enabled" in str(exc):  # a plain server named in a cluster URL: waiting will not help
                raise NotAClusterError(f"{self._describe} is not a Redis Cluster: use redis:// for a server") from None
            raise redis.ConnectionError(f"no node of the cluster {self._describe} answered: {exc}") from None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cluster(), name)

    def close(self) -> None:
        with self._lock:
            if self._cluster is not None:
                _close_cluster(self._cluster)


def _close_cluster(cluster: Any) -> None:
    """Close a cluster client and every socket it opened: ``RedisCluster.close`` closes the nodes
    of its slot map but leaves the connections of its startup nodes to the garbage collector."""
    cluster.close()
    manager = getattr(cluster, "nodes_manager", None)
    if manager is None:
        return
    for node in [*manager.startup_nodes.values(), *manager.nodes_cache.values()]:
        if node.redis_connection is not None:
            node.redis_connection.connection_pool.disconnect()


def _close_half_built(exc: BaseException) -> None:
    """Close what a failed ``RedisCluster(...)`` left connected. redis-py's constructor asks a
    startup node for the slot map on a connection it keeps; when it then fails (a plain server
    behind a cluster URL, a node that answers with an error) nobody closes that connection, and
    its socket waited for the garbage collector: one per failed attempt of a worker in BACKOFF.
    The half-built node manager is reached through the failure's own frames."""
    tb = exc.__traceback__
    while tb is not None:
        manager = tb.tb_frame.f_locals.get("self")
        if isinstance(manager, NodesManager):
            nodes = [*manager.startup_nodes.values(), *manager.nodes_cache.values()]
            for node in nodes:
                if node.redis_connection is not None:
                    with contextlib.suppress(Exception):  # best effort: the failure is what is reported
                        node.redis_connection.close()
        tb = tb.tb_next


def _cluster_client(target: ClusterTarget, options: dict[str, Any], tls: TlsFiles | None) -> redis.Redis:
    """A (lazily built) RedisCluster. It offers the command API plaita uses, hence the cast."""
    kwargs = dict(options)
    kwargs.pop("retry")  # 0 retries: one failure is one BACKOFF; the client reloads its slot map itself
    if target.tls:
        kwargs["ssl"] = True
        if tls is not None:
            tls_options = {"ssl_ca_certs": tls.ca_file, "ssl_certfile": tls.cert_file, "ssl_keyfile": tls.key_file}
            kwargs.update({k: v for k, v in tls_options.items() if v is not None})

    def build() -> RedisCluster:
        return RedisCluster(
            startup_nodes=[ClusterNode(host, port) for host, port in target.nodes],  # type: ignore[no-untyped-call]
            username=target.username,
            password=target.password,
            retry=Retry(NoBackoff(), 0),
            # Reload the slot map at the first connection error or MOVED of a pipeline: its counter
            # starts at 0 in every new pipeline, so the default (every 5th) would never come.
            reinitialize_steps=1,
            **kwargs,
        )

    describe = ",".join(f"{h}:{p}" for h, p in target.nodes)
    return cast(redis.Redis, LazyCluster(build, describe))


def is_cluster(client: Any) -> bool:
    return isinstance(client, (LazyCluster, RedisCluster))


def _pools(client: Any) -> Iterator[Any]:
    if isinstance(client, LazyCluster):
        if client._cluster is None:
            return
        client = client._cluster
    if isinstance(client, RedisCluster):
        for node in client.get_nodes():  # type: ignore[no-untyped-call]
            if node.redis_connection is not None:
                yield node.redis_connection.connection_pool
        return
    yield client.connection_pool


def node_client(client: redis.Redis, key: str) -> redis.Redis:
    """On a cluster, a plain client of the master serving ``key``'s slot (for WAIT, which has no
    key: sent through the cluster client it would go to some other node); else ``client``."""
    if not is_cluster(client):
        return client
    cluster = client.cluster() if isinstance(client, LazyCluster) else client
    node = cluster.get_node_from_key(key)  # type: ignore[attr-defined]
    return cast(redis.Redis, cluster.get_redis_connection(node))  # type: ignore[attr-defined]


def get_many(client: redis.Redis, keys: list[Any]) -> list[Any]:
    """MGET; on Redis Cluster, keys of several slots are fetched slot by slot (not atomic)."""
    if not keys:
        return []
    if is_cluster(client):
        return cast(list[Any], client.mget_nonatomic(keys))  # type: ignore[attr-defined]
    return cast(list[Any], client.mget(keys))


def interrupt(client: Any) -> None:
    """Cut ``client``'s calls in progress (best effort: they fail with ConnectionError), so a stop
    is not held up by BLOCK or a frozen server. Every node's pool on a cluster."""
    for pool in list(_pools(client)):
        for conn in list(getattr(pool, "_in_use_connections", ())):
            sock = getattr(conn, "_sock", None)
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


def _sentinel_client(target: SentinelTarget, options: dict[str, Any]) -> redis.Redis:
    """A client of the master the sentinels name now. After a failover the first call fails
    (ReadOnlyError, a reset or a timeout: the worker backs off) and the next connection asks the
    sentinels again, so the worker follows the new master without a restart."""
    # Through Any: Sentinel and master_for are typed in some redis-py releases and not in others.
    sentinel: Any = cast(Any, Sentinel)(
        target.sentinels,
        sentinel_kwargs={"socket_timeout": CONNECT_TIMEOUT_S, "socket_connect_timeout": CONNECT_TIMEOUT_S},
    )
    client: redis.Redis = sentinel.master_for(
        target.service, db=target.db, username=target.username, password=target.password, **options
    )
    return client


def bounded_clone(client: redis.Redis, timeout_s: float) -> redis.Redis:
    """A client to the same server whose connect and read wait at most ``timeout_s`` (a pool of
    its own: for the calls a stop makes, which must not wait out a frozen server)."""
    if isinstance(client, LazyCluster):
        return _cluster_clone(client.cluster(), timeout_s)
    source = client.connection_pool
    kwargs = dict(source.connection_kwargs)
    kwargs.update(socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
    if isinstance(source, SentinelConnectionPool):
        kwargs.pop("connection_pool", None)  # the new pool puts its own proxy there
        pool: redis.ConnectionPool = SentinelConnectionPool(source.service_name, source.sentinel_manager, **kwargs)  # type: ignore[no-untyped-call]
    else:
        pool = redis.ConnectionPool(connection_class=source.connection_class, **kwargs)
    clone = redis.Redis(connection_pool=pool)
    # The pool is the clone's alone: closing the clone closes its sockets too (a pool passed in is
    # otherwise left open, and a stop's hand-back left a socket for the garbage collector).
    clone.auto_close_connection_pool = True
    return clone


def close_clone(client: redis.Redis) -> None:
    """Close a ``bounded_clone`` and every socket it opened. A cluster clone also holds the
    connections of its startup nodes, which closing the client leaves to the garbage collector."""
    if is_cluster(client):
        _close_cluster(client)
    else:
        client.close()


def delete_keys(client: redis.Redis, keys: list[str]) -> int:
    """DEL ``keys`` in batches of 500; returns how many existed."""
    deleted = 0
    for lo in range(0, len(keys), 500):
        deleted += int(client.delete(*keys[lo : lo + 500]))
    return deleted


def _cluster_clone(cluster: RedisCluster, timeout_s: float) -> redis.Redis:
    """A new cluster client to the nodes ``cluster`` knows now, every wait bounded by ``timeout_s``."""
    kwargs = dict(cluster.nodes_manager.connection_kwargs)
    for key in ("host", "port", "retry", "connection_pool", "connection_class"):
        kwargs.pop(key, None)
    kwargs.update(socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
    nodes = [ClusterNode(n.host, n.port) for n in cluster.get_primaries()]  # type: ignore[no-untyped-call]
    clone = RedisCluster(startup_nodes=nodes, retry=Retry(NoBackoff(), 0), reinitialize_steps=1, **kwargs)
    return cast(redis.Redis, clone)


def clients_for(
    settings: Settings, client: redis.Redis | None, read_client: redis.Redis | None
) -> tuple[redis.Redis, redis.Redis | None]:
    """The given clients, or two new ones for a worker (connected lazily: never raises for Redis
    down): one for acks and renewals, one for the owner's reads, which a stop may cut."""
    if client is not None:
        return client, read_client
    name = f"plaita:{settings.consumer_name}".replace(" ", "_")

    def new() -> redis.Redis:
        return make_client(
            settings.redis_url, socket_timeout_s=settings.socket_timeout_s, client_name=name, tls=settings.tls
        )

    return new(), read_client if read_client is not None else new()
