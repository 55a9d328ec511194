"""``plaita dashboard``: serve the operator's web dashboard with uvicorn.

The port is bound here, before the app starts, so a port in use is one line and exit 2
instead of a server log; the action token is printed once, and only when it was generated.
"""

from __future__ import annotations

import argparse
import errno
import ipaddress
import socket
import sys
from collections.abc import Callable, Mapping

from plaita.config import DEFAULT_CONSUMER_GROUP, DEFAULT_QUEUE_NAME, DEFAULT_REDIS_URL, env_first, redact_url
from plaita.errors import ConfigError

#: Port the dashboard listens on unless told otherwise.
DEFAULT_PORT = 8600
#: A token given by the operator must be at least this long (a generated one is 32 characters).
MIN_TOKEN_CHARS = 16


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--port expects a number, got {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"--port must be within 0..65535 (0 = any free port), got {port}")
    return port


def _bind(text: str) -> str:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--bind expects an IP address like 127.0.0.1, got {text!r}") from None
    return text


def add_parser(add: Callable[..., argparse.ArgumentParser], env: Mapping[str, str]) -> argparse.ArgumentParser:
    """Add the ``dashboard`` subcommand through ``add`` (the CLI's subparser factory)."""
    d = add(
        "dashboard",
        help="serve the web dashboard: fleet, lifecycle, queue, throughput, DLQ",
        description="Serve the operator's web dashboard (loopback by default). Read-only unless "
        "--allow-actions; actions need the token (printed once at start unless given).",
    )
    d.add_argument(
        "--redis-url",
        default=env_first(env, "PLAITA_REDIS_URL", "REDIS_URL"),
        help=f"Redis URL (env PLAITA_REDIS_URL, then REDIS_URL; default {DEFAULT_REDIS_URL})",
    )
    d.add_argument("--queue-name", default=env_first(env, "PLAITA_QUEUE_NAME", "QUEUE_NAME") or DEFAULT_QUEUE_NAME,
                   help="stream key (env PLAITA_QUEUE_NAME, QUEUE_NAME; default %(default)s)")  # fmt: skip
    d.add_argument("--consumer-group", default=env_first(env, "PLAITA_CONSUMER_GROUP") or DEFAULT_CONSUMER_GROUP,
                   help="consumer group (env PLAITA_CONSUMER_GROUP; default %(default)s)")  # fmt: skip
    d.add_argument("--dlq-key", default=env_first(env, "PLAITA_DLQ_KEY") or "",
                   help="DLQ stream (env PLAITA_DLQ_KEY; default <queue>:dlq)")  # fmt: skip
    d.add_argument("--partitions", type=int, default=int(env_first(env, "PLAITA_PARTITIONS") or 1),
                   help="streams of the queue, as the workers have (env PLAITA_PARTITIONS; default 1)")  # fmt: skip
    d.add_argument("--bind", type=_bind, default="127.0.0.1", help="address to listen on (default %(default)s)")
    d.add_argument("--port", type=_port, default=DEFAULT_PORT, help="port (default %(default)s; 0 = any free port)")
    d.add_argument("--allow-actions", action="store_true", help="enable pause/resume/stop and DLQ requeue/purge")
    d.add_argument(
        "--token",
        default=env_first(env, "PLAITA_DASHBOARD_TOKEN"),
        help="action token (env PLAITA_DASHBOARD_TOKEN; default: generated and printed once)",
    )
    return d


def _allowed_hosts(bind: str) -> tuple[str, ...]:
    from plaita.dashboard.app import LOOPBACK_HOSTS

    address = ipaddress.ip_address(bind)
    if address.is_unspecified:
        return ("*",)  # reachable under any name of this machine: no name to pin
    shown = f"[{bind}]" if address.version == 6 else bind
    return tuple(dict.fromkeys([*LOOPBACK_HOSTS, bind, shown]))


def _listen(bind: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ipaddress.ip_address(bind).version == 6 else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((bind, port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        why = "address already in use" if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc))
        raise ConfigError(f"cannot listen on {bind}:{port}: {why}") from None
    return sock


def _token(args: argparse.Namespace) -> tuple[str | None, bool]:
    """(token, generated)."""
    from plaita.dashboard.security import generate_token

    token = args.token or None
    if token is not None and len(token) < MIN_TOKEN_CHARS:
        raise ConfigError(f"--token must be at least {MIN_TOKEN_CHARS} characters")
    if token is None and args.allow_actions:
        return generate_token(), True
    return token, False


def run_dashboard(args: argparse.Namespace) -> int:
    try:
        from plaita.dashboard.app import DashboardConfig, create_app
        from plaita.dashboard.serve import serve
    except ImportError as exc:
        print(f"plaita dashboard: needs the dashboard extra (pip install 'plaita[dashboard]'): {exc}", file=sys.stderr)
        return 2
    url = args.redis_url or DEFAULT_REDIS_URL
    token, generated = _token(args)
    config = DashboardConfig(
        redis_url=url,
        queue_name=args.queue_name,
        consumer_group=args.consumer_group,
        dlq_key=args.dlq_key,
        partitions=args.partitions,
        allow_actions=args.allow_actions,
        token=token,
        allowed_hosts=_allowed_hosts(args.bind),
    )
    config.settings()  # ConfigError (exit 2) on a bad URL or an empty name
    sock = _listen(args.bind, args.port)
    host, port = sock.getsockname()[:2]
    shown_host = f"[{host}]" if ":" in host else host
    mode = "actions enabled" if args.allow_actions else "read-only"
    if ipaddress.ip_address(args.bind).is_unspecified or not ipaddress.ip_address(args.bind).is_loopback:
        print(f"plaita dashboard: warning: listening on {args.bind} exposes the dashboard beyond this machine",
              file=sys.stderr)  # fmt: skip
    print(f"plaita dashboard: serving http://{shown_host}:{port}/ for {redact_url(url)} ({mode})", flush=True)
    if generated:
        print(f"plaita dashboard: action token (printed once): {token}", flush=True)
    serve(create_app(config), sock)
    return 0
