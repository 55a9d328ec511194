"""Client construction: every redis-py client plaita uses is built here.

A worker's client has no hidden retries (a frozen server costs one socket timeout, not ten:
retrying is the lifecycle's job), TCP keepalive, and bounded connect and read timeouts.
"""

from __future__ import annotations

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from plaita.config import TlsFiles

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
    options: dict[str, object] = {}
    if tls is not None and url.startswith("rediss://"):
        options = {"ssl_ca_certs": tls.ca_file, "ssl_certfile": tls.cert_file, "ssl_keyfile": tls.key_file}
    return redis.Redis.from_url(
        url,
        socket_timeout=socket_timeout_s,
        socket_connect_timeout=CONNECT_TIMEOUT_S,
        socket_keepalive=True,
        retry=Retry(NoBackoff(), 0),
        client_name=client_name,
        decode_responses=False,
        **{k: v for k, v in options.items() if v is not None},
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
