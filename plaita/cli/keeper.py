"""``plaita keeper``: recover orphaned executions, time out suspensions, mark zombies, and start
the ticks of every schedule recorded for its queue (``--flows MODULE`` records that module's).

Runs until SIGTERM/SIGINT (stops within about a second, even with Redis frozen); ``--once``
runs one pass: exit 1 (one line) if it failed or another keeper holds the lease, and the
lease is handed back on every exit; ``--dry-run`` reads only and never touches the lease.
A Redis failure never ends the loop.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from plaita.cli.options import tls_of
from plaita.config import DEFAULT_REDIS_URL, Settings, validate_webhook_url
from plaita.errors import ConfigError

if TYPE_CHECKING:
    from plaita.flows.keeper.keeper import Keeper, KeeperSettings
    from plaita.flows.model.definition import Flow
    from plaita.ops.keeper_metrics import KeeperMetrics
    from plaita.ops.metrics import HealthServer

logger = logging.getLogger(__name__)


def add_parser(
    add: Callable[..., argparse.ArgumentParser],
    redis_options: Callable[[argparse.ArgumentParser], None],
    *,
    alert_options: Callable[[argparse.ArgumentParser], None] | None = None,
) -> None:
    k = add(
        "keeper",
        help="recover orphaned executions and time out suspensions",
        description=(
            "Any number may run per queue; one acts at a time (the queue's lease: plaita:keeper:lease for "
            "the default queue). The acting one starts every schedule recorded for its queue."
        ),
    )
    redis_options(k)
    if alert_options is not None:
        alert_options(k)
    k.add_argument(
        "--once", action="store_true", help="one pass, then exit (1 if it failed or another keeper holds the lease)"
    )
    k.add_argument(
        "--dry-run", action="store_true", help="log what would be done; change nothing (never takes the keeper lease)"
    )
    k.add_argument(
        "--flows",
        action="append",
        metavar="MODULE",
        default=[],
        help="record the schedules of MODULE's flows for the queue, run them when acting (repeatable)",
    )
    k.add_argument(
        "--metrics-port",
        type=int,
        default=int(os.environ.get("PLAITA_KEEPER_METRICS_PORT") or 0),
        help="serve /metrics, /healthz and /readyz on this port (env PLAITA_KEEPER_METRICS_PORT; default 0 = off)",
    )
    k.add_argument(
        "--metrics-host",
        default=os.environ.get("PLAITA_KEEPER_METRICS_HOST") or "127.0.0.1",
        help="address for --metrics-port (env PLAITA_KEEPER_METRICS_HOST; default %(default)s, loopback only: "
        "0.0.0.0 opens it to the network)",
    )
    options = (
        ("--interval-s", 5.0, "seconds between passes"),
        ("--zombie-after-s", 7200.0, "running, unleased and not updated this long = error 'orphaned'"),
        ("--retry-cooldown-s", 900.0, "at most one recovery retry per execution per this many seconds"),
        ("--timeout-cooldown-s", 60.0, "a timeout not acted on is sent again after this"),
        ("--orphan-grace-s", 10.0, "running executions updated more recently are left alone"),
        ("--keeper-lease-ttl-s", 30.0, "the acting keeper's lease; another takes over after it"),
    )
    for flag, default, text in options:
        k.add_argument(flag, type=float, default=default, help=f"{text} (default %(default)s)")


def run_keeper(args: argparse.Namespace) -> int:
    from plaita.flows.model.definition import load_flows
    from plaita.ops.alert_events import keeper_sender, orphan_alert
    from plaita.ops.alerts import CLOSE_TIMEOUT_S, REQUEST_TIMEOUT_S
    from plaita.ops.keeper_build import build_keeper
    from plaita.ops.service import KEEPER_SOCKET_TIMEOUT_S
    from plaita.store.client import make_client
    from plaita.store.executions.store import ExecutionStore
    from plaita.store.streams.partitioned import open_queue

    url = args.redis_url or DEFAULT_REDIS_URL
    queue_settings = Settings(redis_url=url, queue_name=args.queue_name, partitions=int(args.partitions))
    settings = _keeper_settings(args)
    webhook = getattr(args, "alert_webhook", None)
    if webhook:
        validate_webhook_url(webhook)
    flows: Iterable[Flow] = load_flows(args.flows) if args.flows else []  # a bad module or schedule: exit 2, one line
    client = make_client(url, socket_timeout_s=KEEPER_SOCKET_TIMEOUT_S, client_name="plaita:keeper", tls=tls_of(args))
    queue = open_queue(queue_settings, client=client)
    store = ExecutionStore(client, queue.keyspace)
    keeper = build_keeper(store, queue, settings, flows=flows)
    metrics, http = _serve_metrics(args, keeper)  # a port in use: exit 2 before anything runs
    alerts = None
    if webhook:
        secret = getattr(args, "alert_webhook_secret", None)
        on_count = metrics.count_alert if metrics is not None else None
        alerts = keeper_sender(webhook, secret, holder=keeper.holder, queue=queue.stream, on_count=on_count).start()
        keeper.on_orphaned = orphan_alert(alerts)

    _stop_on_signals(keeper)
    logger.info("plaita keeper starting on %s (%s)%s", queue.stream, keeper.holder, " dry run" if args.dry_run else "")
    try:
        return keeper.run(once=args.once)
    finally:
        if alerts is not None:
            # Bounded: a hanging webhook never holds a stop; --once gives the last pass's events
            # one request's time to go out.
            alerts.close(REQUEST_TIMEOUT_S if args.once else CLOSE_TIMEOUT_S)
        if http is not None:
            http.stop()
        client.close()
        logger.info("plaita keeper stopped")


def _serve_metrics(args: argparse.Namespace, keeper: Keeper) -> tuple[KeeperMetrics | None, HealthServer | None]:
    """With ``--metrics-port``: the keeper's metrics, told of every pass, served over HTTP."""
    from plaita.ops.keeper_metrics import KeeperMetrics
    from plaita.ops.metrics import HealthServer

    port = int(args.metrics_port)
    if port == 0:
        return None, None
    if not 0 < port < 65536:
        raise ConfigError(f"--metrics-port must be 0 (off) or a port 1-65535, not {port}")
    metrics = KeeperMetrics()
    http = HealthServer(args.metrics_host, port, metrics, metrics.readiness)
    keeper.on_pass, keeper.on_failure = metrics.on_pass, metrics.on_failure
    http.start()
    logger.info("keeper metrics on http://%s:%d/metrics", args.metrics_host, http.port)
    return metrics, http


def _keeper_settings(args: argparse.Namespace) -> KeeperSettings:
    """The keeper's flags as settings; a bad combination is a ConfigError (exit 2, one line)."""
    from plaita.flows.keeper.keeper import KeeperSettings

    try:
        return KeeperSettings(
            interval_s=args.interval_s,
            zombie_after_s=args.zombie_after_s,
            retry_cooldown_s=args.retry_cooldown_s,
            timeout_cooldown_s=args.timeout_cooldown_s,
            orphan_grace_s=args.orphan_grace_s,
            lease_ttl_s=args.keeper_lease_ttl_s,
            dry_run=args.dry_run,
        )
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc)) from None


def _stop_on_signals(keeper: Keeper) -> None:
    """SIGTERM and SIGINT stop the keeper (within about a second, the lease handed over)."""

    def on_signal(_signum: int, _frame: object) -> None:
        keeper.request_stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
