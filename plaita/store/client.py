"""Client construction: every redis-py client plaita uses is built here.

A worker's client has no hidden retries (a frozen server costs one socket timeout, not ten:
retrying is the lifecycle's job), TCP keepalive, and bounded connect and read timeouts.
"""

from __future__ import annotations

from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelConnectionPool

from plaita.config import SENTINEL_SCHEME, SentinelTarget, TlsFiles, parse_sentinel_url

#: Seconds to wait for a TCP connection before counting the attempt as a transient failure.
CONNECT_TIMEOUT_S = 2.0

#: The client type the rest of plaita passes around (so it need not import redis itself).
Client = redis.Redis


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
    if url.startswith(f"{SENTINEL_SCHEME}://"):
        return _sentinel_client(parse_sentinel_url(url), options)
    return redis.Redis.from_url(url, **options)


def _sentinel_client(target: SentinelTarget, options: dict[str, Any]) -> redis.Redis:
    """A client of the master the sentinels name now. After a failover the first call fails
    (ReadOnlyError, a reset or a timeout: the worker backs off) and the next connection asks the
    sentinels again, so the worker follows the new master without a restart."""
    sentinel = Sentinel(  # type: ignore[no-untyped-call]
        target.sentinels,
        sentinel_kwargs={"socket_timeout": CONNECT_TIMEOUT_S, "socket_connect_timeout": CONNECT_TIMEOUT_S},
    )
    client: redis.Redis = sentinel.master_for(  # type: ignore[no-untyped-call]
        target.service, db=target.db, username=target.username, password=target.password, **options
    )
    return client


def bounded_clone(client: redis.Redis, timeout_s: float) -> redis.Redis:
    """A client to the same server whose connect and read wait at most ``timeout_s`` (a pool of
    its own: for the calls a stop makes, which must not wait out a frozen server)."""
    source = client.connection_pool
    kwargs = dict(source.connection_kwargs)
    kwargs.update(socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
    if isinstance(source, SentinelConnectionPool):
        kwargs.pop("connection_pool", None)  # the new pool puts its own proxy there
        pool: redis.ConnectionPool = SentinelConnectionPool(source.service_name, source.sentinel_manager, **kwargs)  # type: ignore[no-untyped-call]
    else:
        pool = redis.ConnectionPool(connection_class=source.connection_class, **kwargs)
    return redis.Redis(connection_pool=pool)


def delete_keys(client: redis.Redis, keys: list[str]) -> int:
    """DEL ``keys`` in batches of 500; returns how many existed."""
    deleted = 0
    for lo in range(0, len(keys), 500):
        deleted += int(client.delete(*keys[lo : lo + 500]))
    return deleted
