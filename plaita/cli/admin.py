"""Operator commands: ``plaita workers | status | stop | pause | resume | dlq``.

Each prints a table (or JSON with ``--json``) and returns an exit code: 0 done, 1 the
command could not be carried out (unknown instance or id, Redis unreachable), 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from plaita.cli.common import json_text, redis_failed
from plaita.cli.options import Unset, tls_of
from plaita.config import DEFAULT_REDIS_URL
from plaita.errors import PlaitaError
from plaita.ops.fleet_admin import Admin, AdminTarget, FleetCommandError, open_admin

if TYPE_CHECKING:
    from plaita.store.streams.dlq import DeadLetterQueue
from plaita.store.streams.dlq import DeadLetterQueue

#: Seconds ``plaita status INSTANCE`` waits for the worker's answer.
STATUS_REPLY_TIMEOUT_S = 5.0
#: Socket timeout of the admin client: above the reply wait, so a worker that does not answer
#: (stopped, frozen) is reported as such and not as a Redis timeout.
ADMIN_SOCKET_TIMEOUT_S = STATUS_REPLY_TIMEOUT_S + 2.0
#: A stream entry id as Redis prints it (``ms-seq``; a bare ``ms`` is accepted too).
#: A DLQ entry id; ``<partition>/`` first on a partitioned queue.
STREAM_ID = re.compile(r"(\d+/)?\d+(-\d+)?")


class AdminError(PlaitaError):
    """Raised for an operator mistake (exit 1 with the message)."""


def _admin(args: argparse.Namespace, *, fleet_partitions: bool = False) -> Admin:
    """The queue the command names. ``fleet_partitions``: without --partitions (or its variable),
    the count the queue's registered workers agree on (``Admin.partitions_from`` says which)."""
    partitions = getattr(args, "partitions", 1)
    target = AdminTarget(
        redis_url=args.redis_url or DEFAULT_REDIS_URL,
        queue_name=args.queue_name,
        consumer_group=args.consumer_group,
        dlq_key=getattr(args, "dlq_key", "") or "",
        tls=tls_of(args),
        partitions=None if fleet_partitions and isinstance(partitions, Unset) else int(partitions),
    )
    # Longer than the status reply wait: a worker that does not answer (SIGSTOPped, say) must read
    # as "did not answer", not as a Redis failure.
    return open_admin(target, socket_timeout_s=ADMIN_SOCKET_TIMEOUT_S)


def _print_table(rows: list[dict[str, Any]], columns: Sequence[str]) -> None:
    cells = [[str(r.get(c, "")) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    print("  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip())
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())


def _emit(args: argparse.Namespace, data: Any, rows: list[dict[str, Any]] | None, columns: Sequence[str]) -> None:
    if getattr(args, "json", False):
        print(json_text(data, indent=2, sort_keys=True, default=str))
    elif rows is not None:
        if rows:
            _print_table(rows, columns)
        else:
            print("(none)")


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def _runs(w: dict[str, Any]) -> str:
    runs = w.get("runs")
    if not isinstance(runs, dict):
        return "-"
    if "handler" in runs:
        return str(runs["handler"])
    flows = runs.get("flows")
    if not isinstance(flows, list):
        flows = []
    # A flow without a declared version is its name alone (not "name@None").
    named = (
        f"{f.get('flow_id')}" + (f"@{f['version']}" if f.get("version") else "") for f in flows if isinstance(f, dict)
    )
    return "flows " + ",".join(named)


def _cut(text: str, width: int, wide: bool) -> str:
    """``text`` whole with ``--wide``, else at most ``width`` characters, a cut one ending in "…"."""
    return text if wide or len(text) <= width else text[: width - 1] + "…"


def cmd_workers(args: argparse.Namespace) -> int:
    admin = _admin(args)
    now = time.time()
    workers = admin.workers()
    wide = bool(getattr(args, "wide", False))
    rows = [
        {
            "instance": w.get("instance_id"),
            "host": w.get("host"),
            "queue": _cut(str(w.get("stream") or "-"), 32, wide),
            "state": w.get("state"),
            "since": _age(now - float(w["state_since"])) if w.get("state_since") else "-",
            "in_flight": w.get("in_flight"),
            "processed": w.get("processed"),
            "failed": w.get("failed"),
            "last_error": _cut(w.get("last_error") or "", 60, wide),
            "heartbeat_age": _age(now - float(w["last_heartbeat"])) if w.get("last_heartbeat") else "-",
            "partitions": w.get("partitions", "-"),
            "runs": _cut(_runs(w), 40, wide),
        }
        for w in workers
    ]
    columns = [
        "instance", "host", "state", "since", "in_flight", "processed", "failed", "last_error", "heartbeat_age",
        "partitions", "queue", "runs",
    ]  # fmt: skip
    _emit(args, workers, rows, columns)
    for line in admin.fleet_problems(workers):
        print(f"plaita workers: problem: {line}", file=sys.stderr)
    return 0


def _warn(text: str) -> None:
    print(f"plaita: {text}", file=sys.stderr)


def cmd_status(args: argparse.Namespace) -> int:
    admin = _admin(args, fleet_partitions=not args.instance)
    if args.instance:
        status = admin.ask_status(admin.resolve_instance(args.instance, _warn), STATUS_REPLY_TIMEOUT_S)
        if args.json:
            _emit(args, status, None, [])
        else:
            for key in sorted(k for k in status if k != "counters"):
                print(f"{key:>14}: {status[key]}")
            print(f"{'counters':>14}: {json.dumps(status.get('counters', {}))}")
        return 0
    stats = admin.queue_status()
    if args.json:
        _emit(args, stats, None, [])
        return 0
    _print_queue_status(stats)
    _print_execution_counts(stats["executions"])
    for flow_id, n in stats["starts_waiting_for_slot"].items():
        print(f"{'waiting for a slot':>22}: {n} start(s) of flow {flow_id}")
    return 0


def _print_queue_status(stats: dict[str, Any]) -> None:
    print(f"stream {stats['stream']}  group {stats['group']}")
    keys = ("length", "pending", "lag", "consumers", "oldest_pending_id", "oldest_pending_age_s", "dlq_length")
    for key in (*keys, "delayed"):
        print(f"{key:>22}: {stats.get(key)}")
    if stats.get("levels"):  # priority levels in use: each one's length, highest first
        by_level = sorted(stats["levels"].items(), key=lambda kv: -int(kv[0]))
        print(f"{'length by priority':>22}: " + ", ".join(f"{level}: {n}" for level, n in by_level))
    print(f"{'partitions':>22}: {stats['partitions_count']} ({stats['partitions_from']})")
    if stats.get("note"):
        print(f"{'note':>22}: {stats['note']}")
    for line in stats["problems"]:
        print(f"{'problem':>22}: {line}")
    for part in stats.get("partitions", []):
        print(
            f"  {part['stream']}: length {part['length']}, pending {part['pending']}, lag {part['lag']}, "
            f"dlq {part['dlq_length']}, delayed {part.get('delayed', 0)}"
        )


def _print_execution_counts(counts: dict[str, Any]) -> None:
    """One line per tenant (the default one first): its executions by status, zeros left out."""

    def line(by_status: dict[str, int]) -> str:
        return ", ".join(f"{n} {status}" for status, n in by_status.items() if n) or "none"

    print(f"{'executions':>22}: {line(counts['default'])}")
    for tenant, by_status in counts["tenants"].items():
        print(f"{'tenant ' + tenant:>22}: {line(by_status)}")
    if counts["tenants_more"]:
        print(f"{'':>22}  … {counts['tenants_more']} more tenant(s), not counted")


def _check_ids(ids: Sequence[str]) -> None:
    for dlq_id in ids:
        if not STREAM_ID.fullmatch(dlq_id):
            raise AdminError(f"{dlq_id!r} is not a stream entry id (like 1717171717171-0; see `plaita dlq list`)")


def cmd_control(args: argparse.Namespace) -> int:
    admin = _admin(args)
    if args.all == bool(args.instance):
        raise AdminError("give exactly one of INSTANCE or --all")
    target = "all" if args.all else admin.resolve_instance(args.instance, _warn)
    received = admin.send(target, args.command, now=getattr(args, "now", False))
    print(f"{args.command} sent to {target} ({received} worker(s) received it)")
    return 0


def _dlq_list(args: argparse.Namespace, dlq: DeadLetterQueue) -> int:
    rows = dlq.oldest(args.count)
    table = [
        {
            "dlq_id": r["dlq_id"],
            "source_id": r.get("source_id"),
            "deliveries": r.get("delivery_count"),
            "age": _age(time.time() - float(r["dead_lettered_at"])) if r.get("dead_lettered_at") else "-",
            "reason": str(r.get("reason", ""))[:70],
        }
        for r in rows
    ]
    _emit(args, rows, table, ["dlq_id", "source_id", "deliveries", "age", "reason"])
    return 0


def _dlq_show(args: argparse.Namespace, dlq: DeadLetterQueue) -> int:
    _check_ids([args.id])
    row = dlq.get(args.id)
    if row is None:
        raise AdminError(f"no dead letter with id {args.id!r} in {dlq.queue.dlq_key}")
    print(json_text(row, indent=2, sort_keys=True, ensure_ascii=False))
    return 0


def _dlq_requeue(args: argparse.Namespace, dlq: DeadLetterQueue) -> int:
    ids = dlq.all_ids() if args.all else list(args.ids)
    _check_ids(ids)
    if not ids:
        raise AdminError("nothing to requeue: give DLQ ids or --all (see `plaita dlq list`)")
    try:
        moved = dlq.requeue(ids)
    except KeyError as exc:
        raise AdminError(f"no dead letter with id {exc.args[0]!r} in {dlq.queue.dlq_key}") from None
    rows = [{"dlq_id": a, "new_id": b} for a, b in moved]
    _emit(args, rows, rows, ["dlq_id", "new_id"])
    return 0


def _dlq_purge(args: argparse.Namespace, dlq: DeadLetterQueue) -> int:
    count = dlq.length()
    if not args.yes:
        if not sys.stdin.isatty():
            raise AdminError(f"refusing to purge {count} dead letter(s) without --yes (no terminal to ask)")
        answer = input(f"Delete all {count} dead letter(s) in {dlq.queue.dlq_key}? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing deleted")
            return 1
    print(f"purged {dlq.purge()} dead letter(s) from {dlq.queue.dlq_key}")
    return 0


DLQ_ACTIONS = {"list": _dlq_list, "show": _dlq_show, "requeue": _dlq_requeue, "purge": _dlq_purge}


def cmd_dlq(args: argparse.Namespace) -> int:
    return DLQ_ACTIONS[args.dlq_command](args, _admin(args).dead_letters())


def run_admin(args: argparse.Namespace) -> int:
    handlers = {
        "workers": cmd_workers,
        "status": cmd_status,
        "stop": cmd_control,
        "pause": cmd_control,
        "resume": cmd_control,
        "dlq": cmd_dlq,
    }
    try:
        return handlers[args.command](args)
    except BrokenPipeError:
        # The reader stopped reading (`plaita status | head`): not an error of the command.
        # Point stdout at /dev/null so the interpreter's final flush does not fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except (AdminError, FleetCommandError) as exc:
        print(f"plaita {args.command}: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:
        return redis_failed(args.command, args.redis_url, exc)
