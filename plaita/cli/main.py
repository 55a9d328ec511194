"""Command line: ``plaita worker | enqueue | workers | status | stop | pause | resume | dlq |
diagram | demo | dev | executions | keeper | schedules | limits | tasks | doctor | dashboard | migrate``.
The only place that configures logging (``plaita.fsm.machine`` only quiets the ``transitions`` library's logger).

Exit codes: 0 normal stop, 1 a command failed (for example Redis unreachable for
``enqueue``), 2 bad configuration (``doctor``: 1 a warning, 3 an error finding). A Redis failure
inside ``worker`` is never an exit code.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from plaita.cli import dashboard as dashboard_cli
from plaita.cli import dev as dev_cli
from plaita.cli import doctor as doctor_cli
from plaita.cli import executions as executions_cli
from plaita.cli import keeper as keeper_cli
from plaita.cli import limits as limits_cli
from plaita.cli import migrate as migrate_cli
from plaita.cli import schedules as schedules_cli
from plaita.cli import tasks as tasks_cli
from plaita.cli.options import (
    CommandGroup,
    WithParents,
    add_alert_options,
    add_priority_option,
    add_redis_options,
    add_worker_options,
    command_group,
    late_redis_options,
)
from plaita.cli.tracing import add_otel_option
from plaita.config import DEFAULT_CONSUMER_GROUP, env_first, environ, redact_text
from plaita.errors import ConfigError
from plaita.version import __version__

LOG_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"
LOG_LEVELS = ["DEBUG", "INFO", "WARNING", "ERROR"]
#: Sub-commands served by plaita.cli.admin.
ADMIN_COMMANDS = ("workers", "status", "stop", "pause", "resume", "dlq")


class _Parser(argparse.ArgumentParser):
    """argparse that prints one clear line (not the whole usage) and exits 2; a URL's password
    in the message (argparse echoes what it could not use) is redacted."""

    def error(self, message: str) -> Any:
        self.exit(2, redact_text(f"{self.prog}: error: {message} (see --help)") + "\n")


def _common_options() -> _Parser:
    """--log-level and --quiet, accepted before and after the sub-command; SUPPRESS keeps a
    value given before the sub-command when none is given after it."""
    common = _Parser(add_help=False)
    common.add_argument(
        "--log-level", default=argparse.SUPPRESS, choices=LOG_LEVELS, type=str.upper, help="log level (default INFO)"
    )
    common.add_argument("--quiet", action="store_true", default=argparse.SUPPRESS, help="log warnings and errors only")
    return common


def _add_worker(add: Any, env: Mapping[str, str]) -> None:
    w = add(
        "worker",
        help="run a worker until SIGTERM/SIGINT",
        description="Consume tasks from the stream. SIGTERM/SIGINT drain and exit 0; a second "
        "signal stops at once. Redis failures are retried with backoff forever.",
    )
    add_redis_options(w, env)
    add_worker_options(w, env)
    add_otel_option(w, env)


def _add_enqueue(add: Any, env: Mapping[str, str]) -> None:
    e = add(
        "enqueue",
        help="add tasks to the stream",
        description="Add tasks: one JSON object as argument, or JSON lines on stdin. Prints ids.",
    )
    add_redis_options(e, env)
    e.add_argument("body", nargs="?", help='task body, e.g. \'{"type":"start","flow_id":"f1"}\'')
    e.add_argument(
        "--wait-replicas",
        type=int,
        default=0,
        help="durable enqueue: return only once this many replicas have the tasks (WAIT), else exit 1; "
        "without it a failover can lose tasks the old master had not replicated yet (default 0)",
    )
    e.add_argument("--wait-timeout-ms", type=int, default=1000, help="how long --wait-replicas waits (default 1000)")
    e.add_argument(
        "--delay-s",
        type=float,
        default=None,
        help="add the tasks to the queue's delayed set, due this many seconds from now (at most 10 years); "
        "any worker moves them onto the stream when due (within --reclaim-interval-s). Prints d-… ids",
    )
    add_priority_option(e)
    add_otel_option(e, env)


def _admin(add: Any, env: Mapping[str, str], name: str, text: str, description: str) -> argparse.ArgumentParser:
    a: argparse.ArgumentParser = add(name, help=text, description=description)
    add_redis_options(a, env)
    a.add_argument(
        "--consumer-group",
        default=env_first(env, "PLAITA_CONSUMER_GROUP") or DEFAULT_CONSUMER_GROUP,
        help=f"consumer group (env PLAITA_CONSUMER_GROUP; default {DEFAULT_CONSUMER_GROUP})",
    )
    a.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return a


def _dlq_key_option(p: argparse.ArgumentParser, env: Mapping[str, str]) -> None:
    p.add_argument(
        "--dlq-key",
        default=env_first(env, "PLAITA_DLQ_KEY") or "",
        help="DLQ stream (env PLAITA_DLQ_KEY; default <queue>:dlq)",
    )


def _add_fleet(add: Any, env: Mapping[str, str]) -> None:
    w = _admin(
        add,
        env,
        "workers",
        "list registered workers",
        "One row per live worker from the registry: instance, host, queue, "
        "state, since, in-flight, processed, failed, last error, heartbeat age, what it runs.",
    )
    w.add_argument("--wide", action="store_true", help="print long names and errors whole (default: cut to fit)")
    st = _admin(
        add,
        env,
        "status",
        "queue status, or one worker's own status",
        "Without INSTANCE: stream length, pending, lag, oldest pending age, consumers, DLQ length. "
        "With INSTANCE: asks that worker over the control channel and prints its answer.",
    )
    st.add_argument("instance", nargs="?", help="worker instance id (or consumer name)")
    _dlq_key_option(st, env)
    for name, text in (
        ("stop", "stop workers (graceful drain; --now skips it)"),
        ("pause", "pause workers: no new reads; in-flight tasks finish"),
        ("resume", "resume paused workers"),
    ):
        c = _admin(
            add, env, name, text, f"{text[0].upper()}{text[1:]}. Target one INSTANCE (id or consumer name) or --all."
        )
        c.add_argument("instance", nargs="?", help="worker instance id (or consumer name)")
        c.add_argument("--all", action="store_true", help="every worker listening on plaita:control:all")
        if name == "stop":
            c.add_argument("--now", action="store_true", help="skip the drain: hand back running work at once")


def _add_dlq(add: Any, env: Mapping[str, str]) -> None:
    dq = _admin(
        add, env, "dlq", "inspect and recover dead letters", "list | show ID | requeue ID... | --all | purge [--yes]"
    )
    _dlq_key_option(dq, env)
    dsub = dq.add_subparsers(dest="dlq_command", required=True, parser_class=_Parser)
    # The connection options are accepted after the action too (`plaita dlq list --redis-url …`).
    late = late_redis_options(env)
    for flag in ("--dlq-key", "--consumer-group"):
        late.add_argument(flag, default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    actions = WithParents(dsub, [late])
    dl = actions.add_parser("list", help="oldest dead letters")
    dl.add_argument("--count", type=int, default=50, help="how many (default %(default)s)")
    dl.add_argument("--json", action="store_true", help="print JSON")
    ds = actions.add_parser("show", help="one dead letter, whole")
    ds.add_argument("id", help="DLQ entry id")
    dr = actions.add_parser("requeue", help="put dead letters back on the stream (body kept, deliveries reset)")
    dr.add_argument("ids", nargs="*", help="DLQ entry ids")
    dr.add_argument("--all", action="store_true", help="requeue every dead letter")
    dr.add_argument("--json", action="store_true", help="print JSON")
    dp = actions.add_parser("purge", help="delete every dead letter")
    dp.add_argument("--yes", action="store_true", help="do not ask for confirmation")


def _add_tools(add: Any) -> None:
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


def build_parser(env: Mapping[str, str]) -> argparse.ArgumentParser:
    parser = _Parser(prog="plaita", description="plaita: a Redis Streams worker that never dies of a Redis fault.")
    parser.add_argument("--version", action="version", version=f"plaita {__version__}")
    parser.add_argument(
        "--log-level",
        default=env_first(env, "PLAITA_LOG_LEVEL") or "INFO",
        choices=LOG_LEVELS,
        type=str.upper,
        help="log level (env PLAITA_LOG_LEVEL; default INFO)",
    )
    parser.add_argument("--quiet", action="store_true", help="log warnings and errors only")
    common = _common_options()
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def add(name: str, **kw: Any) -> argparse.ArgumentParser:
        return sub.add_parser(name, parents=[common], **kw)

    def group(name: str, **kw: Any) -> CommandGroup:
        return command_group(add, lambda p: add_redis_options(p, env), late_redis_options(env), name, **kw)

    _add_worker(add, env)
    _add_enqueue(add, env)
    _add_fleet(add, env)
    _add_dlq(add, env)
    _add_tools(add)
    dashboard_cli.add_parser(add, env)
    dev_cli.add_parser(add, env)
    executions_cli.add_parsers(group)
    keeper_cli.add_parser(
        add, lambda p: add_redis_options(p, env), alert_options=lambda p: add_alert_options(p, env, worker=False)
    )
    schedules_cli.add_parsers(group)
    tasks_cli.add_parsers(group)
    limits_cli.add_parsers(group)
    doctor_cli.add_parser(add, lambda p: add_redis_options(p, env), env)
    migrate_cli.add_parsers(group)
    return parser


def configure_logging(level: str) -> None:
    logging.basicConfig(level=level, format=LOG_FORMAT, stream=sys.stderr)


#: The commands whose module parses and runs them all (imported at start anyway, for their parsers).
_RUNNERS: dict[str, Callable[[argparse.Namespace], int]] = {
    "executions": executions_cli.run_executions,
    "keeper": keeper_cli.run_keeper,
    "schedules": schedules_cli.run_schedules,
    "limits": limits_cli.run_limits,
    "tasks": tasks_cli.run_tasks,
    "doctor": doctor_cli.run_doctor,
    "migrate": migrate_cli.run_migrate,
    "dashboard": dashboard_cli.run_dashboard,
    "dev": dev_cli.run_dev,
}


def _dispatch(args: argparse.Namespace) -> int:
    from plaita.cli import commands

    if args.command == "worker":
        return commands.run_worker(args)
    if args.command == "enqueue":
        return commands.run_enqueue(args)
    if args.command == "diagram":
        return commands.run_diagram(args)
    if args.command in ADMIN_COMMANDS:
        from plaita.cli.admin import run_admin

        return run_admin(args)
    runner = _RUNNERS.get(args.command)
    if runner is not None:
        return runner(args)
    if args.command == "demo":
        from plaita.cli.demo import run_demo

        return run_demo(args)
    raise ConfigError(f"unknown command {args.command!r}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser(environ())
    args = parser.parse_args(argv)
    configure_logging("WARNING" if args.quiet else args.log_level)
    try:
        return _dispatch(args)
    except ConfigError as exc:
        print(f"plaita {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # `plaita status | head`: the reader left. Point stdout at /dev/null so the interpreter's
        # final flush does not raise again, and end quietly.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
