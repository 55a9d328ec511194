"""Command line: ``plaita worker | enqueue | diagram | demo``. The only place that configures logging.

Exit codes: 0 normal stop, 1 a command failed (for example Redis unreachable for
``enqueue``), 2 bad configuration. A Redis failure inside ``worker`` is never an exit code.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from plaita import __version__
from plaita.config import (
    DEFAULT_CLAIM_MIN_IDLE_MS,
    DEFAULT_CONSUMER_GROUP,
    DEFAULT_DLQ_MAX_LEN,
    DEFAULT_DRAIN_TIMEOUT_S,
    DEFAULT_LEASE_TTL_S,
    DEFAULT_MAX_DELIVERIES,
    DEFAULT_MAX_PAYLOAD_BYTES,
    DEFAULT_QUEUE_NAME,
    DEFAULT_READ_BLOCK_MS,
    DEFAULT_RECLAIM_INTERVAL_S,
    DEFAULT_REDIS_URL,
    Settings,
    default_consumer_name,
    env_first,
    environ,
    redact_url,
)
from plaita.errors import ConfigError

logger = logging.getLogger("plaita.cli.main")

LOG_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"


class _Parser(argparse.ArgumentParser):
    """argparse that prints one clear line (not the whole usage) and exits 2."""

    def error(self, message: str) -> Any:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _env_default(env: Mapping[str, str], fallback: Any, *names: str) -> Any:
    value = env_first(env, *names)
    return fallback if value is None else value


def _typed(kind: Callable[[str], Any], name: str) -> Callable[[Any], Any]:
    def convert(raw: Any) -> Any:
        try:
            return kind(raw) if isinstance(raw, str) else raw
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} expects {kind.__name__}, got {raw!r}") from None

    convert.__name__ = kind.__name__
    return convert


def _add_redis_options(p: argparse.ArgumentParser, env: Mapping[str, str]) -> None:
    p.add_argument(
        "--redis-url",
        default=_env_default(env, None, "PLAITA_REDIS_URL", "REDIS_URL"),
        help=f"Redis URL (env PLAITA_REDIS_URL, then REDIS_URL; default {DEFAULT_REDIS_URL})",
    )
    p.add_argument(
        "--queue-name",
        default=_env_default(env, DEFAULT_QUEUE_NAME, "PLAITA_QUEUE_NAME", "QUEUE_NAME"),
        help="stream key (env PLAITA_QUEUE_NAME, QUEUE_NAME; default %(default)s)",
    )


def _add_worker_options(p: argparse.ArgumentParser, env: Mapping[str, str]) -> None:
    def opt(flag: str, kind: Callable[[str], Any], default: Any, envs: Sequence[str], text: str) -> None:
        env_text = f"env {', '.join(envs)}; " if envs else ""
        p.add_argument(
            flag,
            type=_typed(kind, flag),
            default=_env_default(env, default, *envs),
            help=f"{text} ({env_text}default %(default)s)",
        )

    opt("--consumer-group", str, DEFAULT_CONSUMER_GROUP, ["PLAITA_CONSUMER_GROUP"], "consumer group")
    opt(
        "--consumer-name",
        str,
        None,
        ["PLAITA_CONSUMER_NAME"],
        "consumer name; stable names let a restarted worker resume its own pending tasks (default HOSTNAME:SLOT)",
    )
    opt("--slot", int, 0, ["PLAITA_WORKER_SLOT"], "slot number in the default consumer name")
    opt("--handler", str, "plaita.runtime.handlers:echo", ["PLAITA_HANDLER"], "task handler as MODULE:CALLABLE")
    opt("--concurrency", int, 1, ["PLAITA_WORKER_CONCURRENCY"], "tasks run at once (handler threads)")
    opt(
        "--prefetch",
        int,
        None,
        ["PLAITA_WORKER_PREFETCH"],
        "tasks read ahead of free threads; unset = automatic (only while handlers take < 5 ms)",
    )
    opt("--read-block-ms", int, DEFAULT_READ_BLOCK_MS, ["PLAITA_READ_BLOCK_MS"], "XREADGROUP BLOCK in ms")
    opt(
        "--claim-min-idle-ms",
        int,
        DEFAULT_CLAIM_MIN_IDLE_MS,
        ["PLAITA_CLAIM_MIN_IDLE_MS"],
        "reclaim pending entries idle longer than this",
    )
    opt(
        "--reclaim-interval-s",
        float,
        DEFAULT_RECLAIM_INTERVAL_S,
        ["PLAITA_RECLAIM_INTERVAL_S"],
        "seconds between reclaim passes",
    )
    opt(
        "--max-deliveries",
        int,
        DEFAULT_MAX_DELIVERIES,
        ["PLAITA_MAX_DELIVERIES"],
        "deliveries before a failing task goes to the DLQ",
    )
    opt("--dlq-key", str, "", ["PLAITA_DLQ_KEY"], "dead-letter stream (default <queue>:dlq)")
    opt("--dlq-max-len", int, DEFAULT_DLQ_MAX_LEN, ["PLAITA_DLQ_MAX_LEN"], "DLQ trimmed to this many entries")
    opt(
        "--max-payload-bytes",
        int,
        DEFAULT_MAX_PAYLOAD_BYTES,
        ["PLAITA_MAX_PAYLOAD_BYTES"],
        "larger payloads go to the DLQ",
    )
    opt(
        "--drain-timeout-s",
        float,
        DEFAULT_DRAIN_TIMEOUT_S,
        ["PLAITA_WORKER_DRAIN_TIMEOUT"],
        "on SIGTERM, wait this long for running tasks; the rest stay pending",
    )
    opt("--lease-ttl-seconds", float, DEFAULT_LEASE_TTL_S, ["PLAITA_LEASE_TTL_SECONDS"], "execution lease TTL")
    opt(
        "--consumer-prune-idle-s",
        float,
        3600.0,
        ["PLAITA_CONSUMER_PRUNE_IDLE_S"],
        "remove group consumers with nothing pending idle longer than this",
    )
    opt("--status-file", str, None, ["PLAITA_STATUS_FILE"], "rewrite this JSON file with the worker's state")
    opt("--instance-id", str, None, ["PLAITA_INSTANCE_ID"], "registry/control identity (default HOSTNAME-RANDOM8)")
    opt("--registry-ttl", float, 30.0, ["PLAITA_REGISTRY_TTL"], "registry entry TTL in seconds")
    opt("--heartbeat-interval", float, 10.0, ["PLAITA_HEARTBEAT_INTERVAL"], "registry heartbeat in seconds")
    opt("--metrics-port", int, 0, ["PLAITA_METRICS_PORT"], "serve /metrics, /healthz, /readyz here (0 = off)")
    opt("--metrics-host", str, "0.0.0.0", ["PLAITA_METRICS_HOST"], "address for --metrics-port")
    p.add_argument("--no-registry", action="store_true", help="no registry heartbeat and no remote control listener")
    p.add_argument("--flows", action="append", metavar="MODULE", help="run the flows of MODULE (repeatable)")
    p.add_argument("--keeper", action="store_true", help="also run a keeper in this worker (needs --flows)")


def build_parser(env: Mapping[str, str]) -> argparse.ArgumentParser:
    parser = _Parser(prog="plaita", description="plaita: a Redis Streams worker that never dies of a Redis fault.")
    parser.add_argument("--version", action="version", version=f"plaita {__version__}")
    parser.add_argument(
        "--log-level",
        default=_env_default(env, "INFO", "PLAITA_LOG_LEVEL"),
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        type=str.upper,
        help="log level (env PLAITA_LOG_LEVEL; default %(default)s)",
    )
    parser.add_argument("--quiet", action="store_true", help="log warnings and errors only")
    # The same two options after the subcommand (`plaita worker --log-level DEBUG`); SUPPRESS
    # keeps a value given before the subcommand when none is given after it.
    common = _Parser(add_help=False)
    common.add_argument(
        "--log-level",
        default=argparse.SUPPRESS,
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        type=str.upper,
        help="log level (env PLAITA_LOG_LEVEL; default INFO)",
    )
    common.add_argument("--quiet", action="store_true", default=argparse.SUPPRESS, help="log warnings and errors only")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def add(name: str, **kw: Any) -> argparse.ArgumentParser:
        return sub.add_parser(name, parents=[common], **kw)

    w = add(
        "worker",
        help="run a worker until SIGTERM/SIGINT",
        description="Consume tasks from the stream. SIGTERM/SIGINT drain and exit 0; a second "
        "signal stops at once. Redis failures are retried with backoff forever.",
    )
    _add_redis_options(w, env)
    _add_worker_options(w, env)

    e = add(
        "enqueue",
        help="add tasks to the stream",
        description="Add tasks: one JSON object as argument, or JSON lines on stdin. Prints ids.",
    )
    _add_redis_options(e, env)
    e.add_argument("body", nargs="?", help='task body, e.g. \'{"type":"start","flow_id":"f1"}\'')

    def admin(name: str, text: str, description: str) -> argparse.ArgumentParser:
        a = add(name, help=text, description=description)
        _add_redis_options(a, env)
        a.add_argument(
            "--consumer-group",
            default=_env_default(env, DEFAULT_CONSUMER_GROUP, "PLAITA_CONSUMER_GROUP"),
            help="consumer group (env PLAITA_CONSUMER_GROUP; default %(default)s)",
        )
        a.add_argument("--json", action="store_true", help="print JSON instead of a table")
        return a

    admin(
        "workers",
        "list registered workers",
        "One row per live worker from the registry: instance, host, "
        "state, since, in-flight, processed, failed, last error, heartbeat age.",
    )
    st = admin(
        "status",
        "queue status, or one worker's own status",
        "Without INSTANCE: stream length, pending, lag, oldest pending age, consumers, DLQ length. "
        "With INSTANCE: asks that worker over the control channel and prints its answer.",
    )
    st.add_argument("instance", nargs="?", help="worker instance id (or consumer name)")
    st.add_argument("--dlq-key", default=_env_default(env, "", "PLAITA_DLQ_KEY"), help="DLQ stream")
    for name, text in (
        ("stop", "stop workers (graceful drain; --now skips it)"),
        ("pause", "pause workers: no new reads; in-flight tasks finish"),
        ("resume", "resume paused workers"),
    ):
        c = admin(name, text, f"{text[0].upper()}{text[1:]}. Target one INSTANCE (id or consumer name) or --all.")
        c.add_argument("instance", nargs="?", help="worker instance id (or consumer name)")
        c.add_argument("--all", action="store_true", help="every worker listening on plaita:control:all")
        if name == "stop":
            c.add_argument("--now", action="store_true", help="skip the drain: hand back running work at once")
    dq = admin("dlq", "inspect and recover dead letters", "list | show ID | requeue ID... | --all | purge [--yes]")
    dq.add_argument(
        "--dlq-key",
        default=_env_default(env, "", "PLAITA_DLQ_KEY"),
        help="DLQ stream (env PLAITA_DLQ_KEY; default <queue>:dlq)",
    )
    dsub = dq.add_subparsers(dest="dlq_command", required=True, parser_class=_Parser)
    dl = dsub.add_parser("list", help="oldest dead letters")
    dl.add_argument("--count", type=int, default=50, help="how many (default %(default)s)")
    dl.add_argument("--json", action="store_true", help="print JSON")
    ds = dsub.add_parser("show", help="one dead letter, whole")
    ds.add_argument("id", help="DLQ entry id")
    dr = dsub.add_parser("requeue", help="put dead letters back on the stream (body kept, deliveries reset)")
    dr.add_argument("ids", nargs="*", help="DLQ entry ids")
    dr.add_argument("--all", action="store_true", help="requeue every dead letter")
    dr.add_argument("--json", action="store_true", help="print JSON")
    dp = dsub.add_parser("purge", help="delete every dead letter")
    dp.add_argument("--yes", action="store_true", help="do not ask for confirmation")

    d = add("diagram", help="regenerate diagrams/ and docs/states.md from the FSM table")
    d.add_argument("--check", action="store_true", help="exit 1 if a generated file is stale; write nothing")
    d.add_argument("--root", default=".", help="project root (default: current directory)")

    m = add(
        "demo",
        help="watch a worker ride out a Redis freeze on a private redis-server",
        description="Starts a private redis-server (unless --redis-url), a worker, enqueues tasks, "
        "freezes Redis for 5 s mid-run and prints a tally.",
    )
    m.add_argument("--redis-url", default=None, help="use this Redis instead of a private one (no freeze then)")
    m.add_argument("--tasks", type=int, default=300, help="tasks to enqueue (default %(default)s)")
    m.add_argument("--freeze-s", type=float, default=5.0, help="seconds Redis stays frozen (default %(default)s)")
    from plaita.cli import executions, keeper

    executions.add_parsers(add, lambda p: _add_redis_options(p, env))
    keeper.add_parser(add, lambda p: _add_redis_options(p, env))
    return parser


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Settings from parsed ``worker`` arguments; ConfigError on any invalid value."""
    return Settings(
        redis_url=args.redis_url or DEFAULT_REDIS_URL,
        queue_name=args.queue_name,
        consumer_group=args.consumer_group,
        consumer_name=args.consumer_name or default_consumer_name(args.slot),
        read_block_ms=args.read_block_ms,
        claim_min_idle_ms=args.claim_min_idle_ms,
        max_deliveries=args.max_deliveries,
        dlq_key=args.dlq_key,
        dlq_max_len=args.dlq_max_len,
        concurrency=args.concurrency,
        prefetch=args.prefetch,
        drain_timeout_s=args.drain_timeout_s,
        max_payload_bytes=args.max_payload_bytes,
        reclaim_interval_s=args.reclaim_interval_s,
        lease_ttl_s=args.lease_ttl_seconds,
        status_file=args.status_file,
        consumer_prune_idle_s=args.consumer_prune_idle_s,
        instance_id=args.instance_id,
        registry_enabled=not args.no_registry,
        registry_ttl_s=args.registry_ttl,
        heartbeat_interval_s=args.heartbeat_interval,
        metrics_port=args.metrics_port or None,
        metrics_host=args.metrics_host,
    )


def configure_logging(level: str) -> None:
    logging.basicConfig(level=level, format=LOG_FORMAT, stream=sys.stderr)


def run_worker(args: argparse.Namespace) -> int:
    from plaita.runtime.handlers import load_handler
    from plaita.runtime.worker import Worker

    settings = settings_from_args(args)
    if args.flows or args.keeper:
        from plaita.cli.executions import flow_worker

        settings, handler = flow_worker(args.flows or [], settings, keeper=args.keeper)
    else:
        handler = load_handler(args.handler)
    worker = Worker(settings, handler)  # type: ignore[arg-type]
    signals_seen = 0

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal signals_seen
        signals_seen += 1
        # Only post a request: the owner thread turns it into stop_requested.
        worker.request_stop(now=signals_seen > 1)

    owner = threading.Thread(target=_run_owner, args=(worker,), name="plaita-owner")
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    owner.start()
    while owner.is_alive():
        owner.join(0.5)  # the main thread stays free to run signal handlers
    return 0


def _run_owner(worker: Any) -> None:
    try:
        worker.run()
    except Exception:  # a bug, not a Redis failure: say so loudly, still exit cleanly
        logger.critical("worker loop crashed (a plaita bug; please report it)", exc_info=True)


def run_enqueue(args: argparse.Namespace) -> int:
    import redis

    from plaita.store.streams import StreamQueue, make_client
    from plaita.tasks import validate_body

    url = args.redis_url or DEFAULT_REDIS_URL
    Settings(redis_url=url, queue_name=args.queue_name)  # validates the URL
    lines = [args.body] if args.body is not None else [ln for ln in sys.stdin.read().splitlines() if ln.strip()]
    if not lines:
        raise ConfigError("no task given: pass a JSON object or pipe JSON lines on stdin")
    bodies = []
    for number, line in enumerate(lines, 1):
        try:
            bodies.append(validate_body(json.loads(line)))
        except ValueError as exc:
            raise ConfigError(f"task {number} is not valid JSON: {exc}") from None
    client = make_client(url, socket_timeout_s=5.0)
    q = StreamQueue(client, stream=args.queue_name, group="", consumer="", dlq_key="", dlq_max_len=1)
    try:
        for message_id in q.enqueue_many(bodies):
            print(message_id)
    except redis.RedisError as exc:
        print(f"plaita enqueue: Redis at {redact_url(url)} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    finally:
        client.close()
    return 0


def run_diagram(args: argparse.Namespace) -> int:
    root = Path(args.root)
    try:
        return _diagram(root, check=args.check)
    except ValueError as exc:  # README.md without its diagram markers
        print(f"plaita diagram: {exc}", file=sys.stderr)
        return 1


def _diagram(root: Path, *, check: bool) -> int:
    from plaita.fsm.diagram import stale_files, write_files

    if check:
        stale = stale_files(root)
        for path in stale:
            print(f"stale: {path} does not match plaita/fsm/table.py; run `plaita diagram`", file=sys.stderr)
        return 1 if stale else 0
    for path in write_files(root):
        print(f"wrote {path}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser(environ())
    args = parser.parse_args(argv)
    configure_logging("WARNING" if args.quiet else args.log_level)
    try:
        if args.command == "worker":
            return run_worker(args)
        if args.command == "enqueue":
            return run_enqueue(args)
        if args.command == "diagram":
            return run_diagram(args)
        if args.command in ("workers", "status", "stop", "pause", "resume", "dlq"):
            from plaita.cli.admin import run_admin

            return run_admin(args)
        if args.command in ("executions", "keeper"):
            from plaita.cli.executions import run_executions
            from plaita.cli.keeper import run_keeper

            return run_executions(args) if args.command == "executions" else run_keeper(args)
        if args.command == "demo":
            from plaita.cli.demo import run_demo

            return run_demo(args)
    except ConfigError as exc:
        print(f"plaita {args.command}: error: {exc}", file=sys.stderr)
        return 2
    parser.error(f"unknown command {args.command!r}")
    return 2
