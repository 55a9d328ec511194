"""Redis URLs: what ``--redis-url`` accepts (plain, ``redis+sentinel://``, ``redis+cluster://``),
how each is parsed, and how a password is kept out of every message (``redact_url``,
``redact_text``). Re-exported by ``plaita.config``, where these used to live.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from plaita.errors import ConfigError


def redact_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (safe for logs and status)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable redis url>"
    if parts.password is None:
        return url
    user = parts.username or ""
    # The raw host[:port] text: ``parts.port`` raises on a non-numeric port, and the error
    # message for exactly that URL must still be redacted.
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, f"{user}:***@{host}", parts.path, parts.query, parts.fragment))


#: ``scheme://user:password@`` in any text; the password is everything up to the last ``@``
#: of the word (a password may contain ``@`` and ``:``).
_URL_PASSWORD = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^\s:/@'\"]*):[^\s'\"]*@")


def redact_text(text: str) -> str:
    """``text`` with the password of every URL in it replaced by ``***``."""
    return _URL_PASSWORD.sub(lambda m: f"{m.group('head')}:***@", text)


#: Scheme of a Sentinel-managed deployment: ``redis+sentinel://[user:pass@]host:port[,host:port]/service[/db]``.
SENTINEL_SCHEME = "redis+sentinel"


@dataclass(frozen=True)
class SentinelTarget:
    """A parsed ``redis+sentinel://`` URL: the sentinels to ask and the master to follow."""

    sentinels: list[tuple[str, int]]
    service: str
    db: int
    username: str | None
    password: str | None


def parse_sentinel_url(url: str) -> SentinelTarget:
    """The parts of a ``redis+sentinel://`` URL; ConfigError (password redacted) when malformed."""
    parts = urlsplit(url)
    userinfo, _, hosts = parts.netloc.rpartition("@")
    sentinels = _host_ports(url, hosts, "sentinels")
    path = [p for p in parts.path.split("/") if p]
    if not path or len(path) > 2 or (len(path) == 2 and not path[1].isdigit()):
        raise ConfigError(f"invalid --redis-url {redact_url(url)!r}: expected /SERVICE_NAME[/DB] after the sentinels")
    user, _, password = userinfo.partition(":")
    return SentinelTarget(sentinels, path[0], int(path[1]) if len(path) == 2 else 0, user or None, password or None)


#: Scheme of a Redis Cluster: ``redis+cluster://[user:pass@]host:port[,host:port]`` (any masters or
#: replicas of the cluster as startup nodes; ``rediss+cluster://`` for TLS).
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")


@dataclass(frozen=True)
class ClusterTarget:
    """A parsed ``redis+cluster://`` URL: the startup nodes and the credentials."""

    nodes: list[tuple[str, int]]
    username: str | None
    password: str | None
    tls: bool


def is_cluster_url(url: str) -> bool:
    return url.split("://", 1)[0] in CLUSTER_SCHEMES


def _host_ports(url: str, hosts: str, what: str) -> list[tuple[str, int]]:
    out = []
    for item in hosts.split(","):
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"invalid --redis-url {redact_url(url)!r}: {what} must be host:port[,host:port]")
        out.append((host.strip("[]"), int(port)))
    return out


def parse_cluster_url(url: str) -> ClusterTarget:
    """The parts of a ``redis+cluster://`` URL; ConfigError (password redacted) when malformed."""
    parts = urlsplit(url)
    userinfo, _, hosts = parts.netloc.rpartition("@")
    nodes = _host_ports(url, hosts, "cluster nodes")
    if parts.path.strip("/") not in ("", "0"):
        raise ConfigError(f"invalid --redis-url {redact_url(url)!r}: a cluster has only database 0")
    user, _, password = userinfo.partition(":")
    return ClusterTarget(nodes, user or None, password or None, parts.scheme == "rediss+cluster")


def validate_redis_url(url: str) -> None:
    """Raise ConfigError (never echoing a password) unless ``url`` is a usable Redis URL."""
    if url.startswith(f"{SENTINEL_SCHEME}://"):
        parse_sentinel_url(url)
        return
    if is_cluster_url(url):
        parse_cluster_url(url)
        return
    try:
        parts = urlsplit(url)
        _ = parts.port  # raises ValueError on a non-numeric port
    except ValueError as exc:
        raise ConfigError(f"invalid --redis-url {redact_url(url)!r}: {exc}") from None
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise ConfigError(
            f"invalid --redis-url {redact_url(url)!r}: scheme must be redis://, rediss://, unix://, "
            "redis+sentinel:// or redis+cluster://"
        )
    if parts.scheme != "unix" and not parts.hostname:
        raise ConfigError(f"invalid --redis-url {redact_url(url)!r}: no host")
    db = parts.path.lstrip("/")
    if parts.scheme != "unix" and db and not db.isdigit():
        raise ConfigError(f"invalid --redis-url {redact_url(url)!r}: database must be a number")
