"""The worker's flags as data: one row per flag, its ``Settings`` field, environment variables
and help. Defaults are never written here: they come from ``Settings`` itself, so the CLI,
``--help`` and the Python API cannot disagree.

One unit-suffix convention: ``-ms`` and ``-s``. The older spellings (``--lease-ttl-seconds``,
``--registry-ttl``, ``--heartbeat-interval``) stay accepted as aliases, so unit files and scripts
written for them keep working; so do their environment variables.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from plaita.config import DEFAULT_REDIS_URL, Settings, TlsFiles, check_readable, default_consumer_name, env_first

if TYPE_CHECKING:
    from plaita.flows.producer.client import FlowClient
    from plaita.store.queue_access import QueueOptions


@dataclass(frozen=True)
class Opt:
    """One worker flag. ``field`` None = not a Settings field (read by the CLI itself)."""

    flag: str
    field: str | None
    kind: Callable[[str], Any]
    envs: tuple[str, ...]
    help: str
    aliases: tuple[str, ...] = ()
    default: Any = None  # only for flags that are not Settings fields
    #: How --help shows a default that is not a plain value (None means "computed" or "off").
    shown: str | None = None


def seconds(raw: str) -> float:
    """An argparse type: a finite number of seconds >= 0 (NaN or inf would wait for ever)."""
    try:
        value = float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {raw!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds >= 0, not {raw!r}")
    return value


def partition_list(raw: str) -> tuple[int, ...]:
    """``0,2,4`` (or ``0-2,5``) as partition numbers."""
    out: list[int] = []
    for item in raw.split(","):
        low, sep, high = item.strip().partition("-")
        if not low.isdigit() or (sep and not high.isdigit()):
            raise ValueError(raw)
        out += range(int(low), int(high) + 1) if sep else [int(low)]
    return tuple(sorted(set(out)))


partition_list.__name__ = "partition list"


WORKER_OPTIONS: tuple[Opt, ...] = (
    Opt("--consumer-group", "consumer_group", str, ("PLAITA_CONSUMER_GROUP",), "consumer group"),
    Opt(
        "--consumer-name",
        "consumer_name",
        str,
        ("PLAITA_CONSUMER_NAME",),
        "consumer name; a stable name lets a restarted worker resume its own pending tasks",
        shown="HOSTNAME:SLOT",
    ),
    Opt("--slot", None, int, ("PLAITA_WORKER_SLOT",), "slot number in the default consumer name", default=0),
    Opt(
        "--handler",
        None,
        str,
        ("PLAITA_HANDLER",),
        "task handler as MODULE:CALLABLE; a worker needs this or --flows, never both (no default: a worker must "
        "never consume a queue's tasks with a handler nobody chose)",
        shown="none",
    ),
    Opt(
        "--concurrency",
        "concurrency",
        int,
        ("PLAITA_WORKER_CONCURRENCY",),
        "tasks run at once (handler threads; with --pool process also the number of child processes)",
    ),
    Opt(
        "--pool",
        "pool",
        str,
        ("PLAITA_POOL",),
        "where steps and handlers run: thread (the worker's threads and event loop) or process (a prefork pool "
        "of --concurrency child processes started with forkserver, or spawn where the platform has no "
        "forkserver; never a plain fork of the threaded worker). In process, a step or handler that kills its "
        "process (os._exit, SIGKILL, a segfault) fails only its own attempt and its child is replaced; the "
        "worker alone talks to Redis",
    ),
    Opt(
        "--max-tasks-per-child",
        "max_tasks_per_child",
        int,
        ("PLAITA_MAX_TASKS_PER_CHILD",),
        "--pool process: replace a child after this many steps or handler calls (leaks stay bounded)",
        shown="never",
    ),
    Opt(
        "--max-memory-per-child-mb",
        "max_memory_per_child_mb",
        int,
        ("PLAITA_MAX_MEMORY_PER_CHILD_MB",),
        "--pool process: replace a child whose resident memory is over this many MiB after a task",
        shown="no limit",
    ),
    Opt(
        "--step-time-limit-s",
        "step_time_limit_s",
        seconds,
        ("PLAITA_STEP_TIME_LIMIT_S",),
        "time limit of every step without a time_limit_s of its own (and of every handler call in --pool "
        "process): in --pool process the child is killed at the limit and the attempt fails with StepTimeLimit; "
        "in threads the limit is soft (ctx.cancelled is set at the limit; the step runs to its end, holding its "
        "slot, and its result is discarded)",
        shown="none",
    ),
    Opt(
        "--prefetch",
        "prefetch",
        int,
        ("PLAITA_WORKER_PREFETCH",),
        "tasks read ahead of free threads; automatic = read ahead only while handlers take < 5 ms",
        shown="automatic",
    ),
    Opt("--read-block-ms", "read_block_ms", int, ("PLAITA_READ_BLOCK_MS",), "XREADGROUP BLOCK in ms"),
    Opt(
        "--claim-min-idle-ms",
        "claim_min_idle_ms",
        int,
        ("PLAITA_CLAIM_MIN_IDLE_MS",),
        "reclaim pending entries idle longer than this",
    ),
    Opt(
        "--reclaim-interval-s",
        "reclaim_interval_s",
        float,
        ("PLAITA_RECLAIM_INTERVAL_S",),
        "seconds between reclaim passes",
    ),
    Opt(
        "--max-deliveries",
        "max_deliveries",
        int,
        ("PLAITA_MAX_DELIVERIES",),
        "deliveries before a failing task goes to the DLQ",
    ),
    Opt(
        "--max-crashes",
        "max_crashes",
        int,
        ("PLAITA_MAX_CRASHES",),
        "times a task may kill its worker process (at least once running alone) before it goes to the DLQ",
    ),
    Opt(
        "--version-wait-s",
        "version_wait_s",
        float,
        ("PLAITA_VERSION_WAIT_S",),
        "a flow start asking for a version no live worker runs is handed back, waiting for one, this long"
        " before it goes to the DLQ (0: at once)",
    ),
    Opt("--dlq-key", "dlq_key", str, ("PLAITA_DLQ_KEY",), "dead-letter stream", shown="<queue>:dlq"),
    Opt("--dlq-max-len", "dlq_max_len", int, ("PLAITA_DLQ_MAX_LEN",), "DLQ trimmed to this many entries"),
    Opt(
        "--max-payload-bytes",
        "max_payload_bytes",
        int,
        ("PLAITA_MAX_PAYLOAD_BYTES",),
        "larger payloads go to the DLQ",
    ),
    Opt(
        "--drain-timeout-s",
        "drain_timeout_s",
        float,
        ("PLAITA_WORKER_DRAIN_TIMEOUT",),
        "on SIGTERM, wait this long for running tasks; the rest are handed back",
    ),
    Opt(
        "--lease-ttl-s",
        "lease_ttl_s",
        float,
        ("PLAITA_LEASE_TTL_SECONDS",),
        "execution lease TTL in seconds",
        aliases=("--lease-ttl-seconds",),
    ),
    Opt(
        "--lease-format",
        "lease_format",
        str,
        ("PLAITA_LEASE_FORMAT",),
        "execution lease format written: v1 (two keys per execution, what every plaita reads) or v2 (one key, "
        "no fence key left behind: less Redis CPU and memory per leased task). This version reads both; switch "
        "to v2 only once every worker on the queue runs a version that reads it (docs/reliability.md, Lease format)",
    ),
    Opt(
        "--consumer-prune-idle-s",
        "consumer_prune_idle_s",
        float,
        ("PLAITA_CONSUMER_PRUNE_IDLE_S",),
        "remove group consumers with nothing pending idle longer than this",
    ),
    Opt(
        "--status-file",
        "status_file",
        str,
        ("PLAITA_STATUS_FILE",),
        "rewrite this JSON file with the worker's state",
        shown="none",
    ),
    Opt(
        "--instance-id",
        "instance_id",
        str,
        ("PLAITA_INSTANCE_ID",),
        "registry/control identity",
        shown="HOSTNAME-RANDOM8, new per process",
    ),
    Opt(
        "--registry-ttl-s",
        "registry_ttl_s",
        float,
        ("PLAITA_REGISTRY_TTL",),
        "registry entry TTL in seconds",
        aliases=("--registry-ttl",),
    ),
    Opt(
        "--heartbeat-interval-s",
        "heartbeat_interval_s",
        float,
        ("PLAITA_HEARTBEAT_INTERVAL",),
        "registry heartbeat in seconds",
        aliases=("--heartbeat-interval",),
    ),
    Opt(
        "--metrics-port",
        "metrics_port",
        int,
        ("PLAITA_METRICS_PORT",),
        "serve /metrics, /healthz, /readyz on this port (0 = off)",
        shown="off",
    ),
    Opt(
        "--metrics-host",
        "metrics_host",
        str,
        ("PLAITA_METRICS_HOST",),
        "address for --metrics-port (loopback by default; 0.0.0.0 opens it to the network)",
    ),
    Opt(
        "--partitions-assigned",
        "partitions_assigned",
        partition_list,
        ("PLAITA_PARTITIONS_ASSIGNED",),
        "read and reclaim only these partitions, e.g. 0,2,4 or 0-2 (the others are left to other workers)",
        shown="all",
    ),
    Opt(
        "--keeper-lease-ttl-s",
        "keeper_lease_ttl_s",
        float,
        ("PLAITA_KEEPER_LEASE_TTL_S",),
        "with --keeper: its keeper lease, renewed every third of it; after a kill -9 of the worker "
        "holding it, another worker's keeper takes over within about this long",
    ),
)

#: The alert webhook: ``plaita worker`` and ``plaita keeper`` (its secret: ``ALERT_SECRET_ENV``).
ALERT_OPTIONS: tuple[Opt, ...] = (
    Opt(
        "--alert-webhook",
        "alert_webhook",
        str,
        ("PLAITA_ALERT_WEBHOOK",),
        "POST JSON alert events (dead_letter, execution_error, zombie_reaped, backoff_stuck, "
        "backoff_recovered) to this http(s) URL; with PLAITA_ALERT_WEBHOOK_SECRET set, each is "
        "signed in X-Plaita-Signature (see docs/operations.md)",
        shown="off",
    ),
)
#: Worker only: when an outage is worth an alert.
ALERT_WORKER_OPTIONS: tuple[Opt, ...] = (
    Opt(
        "--alert-backoff-s",
        "alert_backoff_s",
        float,
        ("PLAITA_ALERT_BACKOFF_S",),
        "send one backoff_stuck alert when an outage (BACKOFF and its retries) lasts longer than this",
    ),
)
#: The webhook's HMAC secret comes from the environment only: a flag would show in ``ps``.
ALERT_SECRET_ENV = "PLAITA_ALERT_WEBHOOK_SECRET"


def add_priority_option(p: argparse.ArgumentParser) -> None:
    """``--priority 0..9`` of every command that enqueues a start or a task (argparse refuses any
    other value with exit 2)."""
    p.add_argument(
        "--priority",
        type=int,
        choices=range(10),
        default=0,
        metavar="0..9",
        help="0..9: higher levels are read first, a lower one never starved (default 0)",
    )


def add_alert_options(p: argparse.ArgumentParser, env: Mapping[str, str], *, worker: bool = True) -> None:
    """``--alert-webhook`` (and for a worker ``--alert-backoff-s``); the secret from the environment."""
    add_options(p, env, ALERT_OPTIONS + (ALERT_WORKER_OPTIONS if worker else ()))
    p.set_defaults(alert_webhook_secret=env_first(env, ALERT_SECRET_ENV))


#: TLS files for a ``rediss://`` URL: accepted by every command that talks to Redis.
TLS_OPTIONS: tuple[Opt, ...] = (
    Opt(
        "--tls-ca-file",
        "tls_ca_file",
        str,
        ("PLAITA_TLS_CA_FILE",),
        "CA bundle that signed the server's certificate (rediss:// URLs)",
        shown="the system's CAs",
    ),
    Opt(
        "--tls-cert-file",
        "tls_cert_file",
        str,
        ("PLAITA_TLS_CERT_FILE",),
        "client certificate (rediss://)",
        shown="none",
    ),
    Opt(
        "--tls-key-file",
        "tls_key_file",
        str,
        ("PLAITA_TLS_KEY_FILE",),
        "client certificate's key (rediss://)",
        shown="none",
    ),
)

#: Settings defaults by field name (a default_factory field has none: its flag shows "computed").
_DEFAULTS: dict[str, Any] = {
    f.name: f.default for f in dataclasses.fields(Settings) if f.default is not dataclasses.MISSING
}


def _typed(kind: Callable[[str], Any], name: str) -> Callable[[Any], Any]:
    """argparse type that names the flag in its error, and refuses nan/inf for floats."""

    def convert(raw: Any) -> Any:
        try:
            value = kind(raw) if isinstance(raw, str) else raw
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} expects {kind.__name__}, got {raw!r}") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{name} must be a finite number, got {raw!r}")
        return value

    convert.__name__ = kind.__name__
    return convert


def default_of(opt: Opt) -> Any:
    return _DEFAULTS.get(opt.field) if opt.field is not None else opt.default


def add_options(p: argparse.ArgumentParser, env: Mapping[str, str], options: Sequence[Opt]) -> None:
    """Add ``options`` to ``p``; an environment variable overrides the Settings default."""
    for opt in options:
        from_env = env_first(env, *opt.envs)
        default = default_of(opt) if from_env is None else from_env
        shown = opt.shown if opt.shown is not None else default_of(opt)
        env_text = f"env {', '.join(opt.envs)}; " if opt.envs else ""
        p.add_argument(
            opt.flag,
            *opt.aliases,
            dest=opt.flag.removeprefix("--").replace("-", "_"),
            type=_typed(opt.kind, opt.flag),
            default=default,
            help=f"{opt.help} ({env_text}default {shown})",
        )


class Unset(int):
    """A default no flag or environment variable chose: ``plaita status`` then asks the fleet."""


def add_redis_options(p: argparse.ArgumentParser, env: Mapping[str, str]) -> None:
    p.add_argument(
        "--redis-url",
        default=env_first(env, "PLAITA_REDIS_URL", "REDIS_URL"),
        help=f"Redis URL (env PLAITA_REDIS_URL, then REDIS_URL; default {DEFAULT_REDIS_URL})",
    )
    p.add_argument(
        "--queue-name",
        default=env_first(env, "PLAITA_QUEUE_NAME", "QUEUE_NAME") or _DEFAULTS["queue_name"],
        help=f"stream key (env PLAITA_QUEUE_NAME, QUEUE_NAME; default {_DEFAULTS['queue_name']})",
    )
    p.add_argument(
        "--partitions",
        type=_typed(int, "--partitions"),
        default=env_first(env, "PLAITA_PARTITIONS") or Unset(_DEFAULTS["partitions"]),
        help="streams the queue is split into, <queue>:{p<i>} each; producers, workers and admin commands "
        "must agree (env PLAITA_PARTITIONS; default 1 = the single stream <queue>)",
    )
    add_options(p, env, TLS_OPTIONS)


def late_redis_options(env: Mapping[str, str]) -> argparse.ArgumentParser:
    """The Redis flags again, for the actions of a command group (``plaita executions list
    --redis-url …``): hidden, and SUPPRESS keeps a value given before the action when none is
    given after it."""
    late = argparse.ArgumentParser(add_help=False)
    add_redis_options(late, env)
    for action in late._actions:
        action.default, action.help = argparse.SUPPRESS, argparse.SUPPRESS
    return late


class WithParents:
    """Adds the same parent parsers to every parser a sub-parsers action creates."""

    def __init__(self, sub: Any, parents: list[argparse.ArgumentParser]) -> None:
        self._sub, self._parents = sub, parents

    def add_parser(self, name: str, **kw: Any) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = self._sub.add_parser(name, parents=self._parents, **kw)
        return parser


@dataclass(frozen=True)
class CommandGroup:
    """A command whose actions are subcommands: its ``parser`` (with the Redis flags), the
    sub-parsers of its ``actions`` (one is required, in ``args.<name>_command``), and ``late``,
    the Redis flags again, which every action takes after it too."""

    parser: argparse.ArgumentParser
    actions: WithParents
    late: argparse.ArgumentParser


#: Makes a ``CommandGroup`` (``command_group`` on the main parser): a name and ``add``'s keywords.
GroupMaker = Callable[..., CommandGroup]


def command_group(
    add: Callable[..., argparse.ArgumentParser],
    redis_options: Callable[[argparse.ArgumentParser], None],
    late: argparse.ArgumentParser,
    name: str,
    **kw: Any,
) -> CommandGroup:
    """The command ``name`` (``add``: the main parser's subcommand factory; ``kw``: its help and
    description) with ``redis_options``, its actions taking ``late`` after them."""
    parser = add(name, **kw)
    redis_options(parser)
    sub = parser.add_subparsers(dest=f"{name}_command", required=True, parser_class=type(parser))
    return CommandGroup(parser, WithParents(sub, [late]), late)


def tls_of(args: argparse.Namespace) -> TlsFiles:
    """The TLS files the command was given (checked readable; never printed)."""
    files = TlsFiles(
        getattr(args, "tls_ca_file", None), getattr(args, "tls_cert_file", None), getattr(args, "tls_key_file", None)
    )
    for flag, path in (
        ("--tls-ca-file", files.ca_file),
        ("--tls-cert-file", files.cert_file),
        ("--tls-key-file", files.key_file),
    ):
        check_readable(flag, path)
    return files


def add_worker_options(p: argparse.ArgumentParser, env: Mapping[str, str]) -> None:
    add_options(p, env, WORKER_OPTIONS)
    p.add_argument("--no-registry", action="store_true", help="no registry heartbeat and no remote control listener")
    p.add_argument("--flows", action="append", metavar="MODULE", help="run the flows of MODULE (repeatable)")
    p.add_argument("--keeper", action="store_true", help="also run a keeper in this worker (needs --flows)")
    p.add_argument(
        "--tasks",
        metavar="MODULE",
        help="run the named tasks of MODULE's plaita.TaskRegistry (bodies routed by task name; alone: "
        "not with --handler or --flows)",
    )
    add_alert_options(p, env)


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Settings from parsed ``worker`` arguments; ConfigError on any invalid value."""
    values: dict[str, Any] = {
        opt.field: getattr(args, opt.flag.removeprefix("--").replace("-", "_"))
        for opt in (*WORKER_OPTIONS, *TLS_OPTIONS, *ALERT_OPTIONS, *ALERT_WORKER_OPTIONS)
        if opt.field is not None
    }
    values["alert_webhook"] = values["alert_webhook"] or None
    values["alert_webhook_secret"] = getattr(args, "alert_webhook_secret", None)
    values["consumer_name"] = values["consumer_name"] or default_consumer_name(args.slot)
    # The flag's 0 is "off" (as its --help says); Settings' 0 is "any free port", which a program
    # asks for (tests), never an operator.
    values["metrics_port"] = values["metrics_port"] or None
    values["dlq_key"] = values["dlq_key"] or ""
    return Settings(
        redis_url=args.redis_url or DEFAULT_REDIS_URL,
        queue_name=args.queue_name,
        partitions=int(args.partitions),
        registry_enabled=not args.no_registry,
        **values,
    )


def flow_client_of(args: argparse.Namespace, *, tenant_id: str | None = None) -> FlowClient:
    """The ``FlowClient`` a producer-side command's flags name (URL, queue, partitions, TLS)."""
    from plaita.flows.producer.client import FlowClient  # imported on use: most commands need no flows

    return FlowClient.from_url(args.redis_url or DEFAULT_REDIS_URL, tenant_id=tenant_id, **producer_queue_of(args))


def producer_queue_of(args: argparse.Namespace) -> QueueOptions:
    """The queue a producer-side command's flags name (queue, partitions, TLS files), as
    ``FlowClient.from_url`` and ``TaskClient.from_url`` take it."""
    tls = tls_of(args)
    options: QueueOptions = {
        "queue_name": args.queue_name,
        "partitions": int(args.partitions),
        "tls_ca_file": tls.ca_file,
        "tls_cert_file": tls.cert_file,
        "tls_key_file": tls.key_file,
    }
    return options
