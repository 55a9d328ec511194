"""Client construction: every redis-py client plaita uses is built here.

A worker's client has no hidden retries (a frozen server costs one socket timeout, not ten:
retrying is the lifecycle's job), TCP keepalive, and bounded connect and read timeouts.
"""

from __future__ import annotations

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

#: Seconds to wait for a TCP connection before counting the attempt as a transient failure.
CONNECT_TIMEOUT_S = 2.0

#: The client type the rest of plaita passes around (so it need not import redis itself).
Client = redis.Redis


def make_client(url: str, *, socket_timeout_s: float, client_name: str | None = None) -> redis.Redis:
    """A redis-py client tuned for a worker: no hidden retries, keepalive, bounded timeouts."""
    return redis.Redis.from_url(
        url,
        socket_timeout=socket_timeout_s,
        socket_connect_timeout=CONNECT_TIMEOUT_S,
        socket_keepalive=True,
        retry=Retry(NoBackoff(), 0),
        client_name=client_name,
        decode_responses=False,
    )


def bounded_clone(client: redis.Redis, timeout_s: float) -> redis.Redis:
    """A client to the same server whose connect and read wait at most ``timeout_s`` (a pool of
    its own: for the calls a stop makes, which must not wait out a frozen server)."""
    kwargs = dict(client.connection_pool.connection_kwargs)
    kwargs.update(socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
    pool = redis.ConnectionPool(connection_class=client.connection_pool.connection_class, **kwargs)
    return redis.Redis(connection_pool=pool)


def delete_keys(client: redis.Redis, keys: list[str]) -> int:
    """DEL ``keys`` in batches of 500; returns how many existed."""
    deleted = 0
    for lo in range(0, len(keys), 500):
        deleted += int(client.delete(*keys[lo : lo + 500]))
    return deleted
