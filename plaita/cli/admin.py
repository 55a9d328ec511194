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
import uuid
from collections.abc import Sequence
from typing import Any

from plaita.cli.common import json_text, redis_failed
from plaita.cli.options import Unset, tls_of
from plaita.config import DEFAULT_REDIS_URL, Settings
from plaita.errors import PlaitaError
from plaita.ops import fleetcheck
from plaita.store import fleet
from plaita.store.client import Client, is_cluster, make_client
from plaita.store.executions.flow_limits import waiting_starts
from plaita.store.fleet import list_workers, send_command
from plaita.store.keyspace import Keyspace
from plaita.store.stats import execution_counts, stray_streams, stream_stats_or_empty
from plaita.store.streams.dlq import DeadLetterQueue
from plaita.store.streams.partitioned import open_queue
from plaita.store.streams.queue import StreamQueue

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


def _queue(args: argparse.Namespace, *, fleet_partitions: bool = False) -> StreamQueue:
    """The queue the command names. ``fleet_partitions``: without --partitions (or its variable),
    the count the queue's registered workers agree on (``args.partitions_from`` says which)."""
    url = args.redis_url or DEFAULT_REDIS_URL
    # Longer than the status reply wait: a worker that does not answer (SIGSTOPped, say) must read
    # as "did not answer", not as a Redis failure.
    client = make_client(url, socket_timeout_s=ADMIN_SOCKET_TIMEOUT_S, tls=tls_of(args))
    partitions = int(getattr(args, "partitions", 1))
    args.partitions_from = "--partitions"
    if fleet_partitions and isinstance(getattr(args, "partitions", None), Unset):
        counts = fleetcheck.fleet_partitions(
            fleetcheck.same_queue(list_workers(client), args.queue_name, args.consumer_group)
        )
        args.partitions_from = "default (no worker registered)"
        if counts:
            partitions = max(counts)  # on a mismatch the problems say so; the larger count shows more
            args.partitions_from = "the registered workers'" if len(counts) == 1 else "the largest of the workers'"
    settings = Settings(
        redis_url=url,
        queue_name=args.queue_name,
        consumer_group=args.consumer_group,
        consumer_name="plaita-admin",
        dlq_key=getattr(args, "dlq_key", "") or "",
        partitions=partitions,
    )
    return open_queue(settings, client=client)


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


def _fleet_problems(q: StreamQueue, workers: list[dict[str, Any]]) -> list[str]:
    """The problems of every queue the registered workers consume (with the count they use)."""
    out: list[str] = []
    for queue, group in sorted({(str(w.get("stream")), str(w.get("group"))) for w in workers}):
        members = fleetcheck.same_queue(workers, queue, group)
        n = max(fleetcheck.fleet_partitions(members) or {1})
        ks = Keyspace(queue, n, n > 1 or is_cluster(q.client))
        out += fleetcheck.problems(members, stray_streams(q.client, ks)[0], queue=queue, partitions=n)
    return out


def cmd_workers(args: argparse.Namespace) -> int:
    q = _queue(args)
    now = time.time()
    workers = list_workers(q.client)
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
    for line in _fleet_problems(q, workers):
        print(f"plaita workers: problem: {line}", file=sys.stderr)
    return 0


def _resolve_instance(client: Client, instance: str) -> str:
    if fleet.is_registered(client, instance):
        return instance
    matches = [w for w in list_workers(client) if w.get("consumer") == instance]  # also accept a consumer name
    if matches:
        # A worker killed moments ago leaves its entry (until its TTL) under the consumer name
        # its restarted successor uses: address the one that listens, else the freshest.
        live = [w for w in matches if fleet.listeners(client, str(w["instance_id"]))]
        newest = max(live or matches, key=lambda w: float(w.get("last_heartbeat") or 0))
        return str(newest["instance_id"])
    if fleet.listeners(client, instance):
        # Its registry entry expired (say Redis refused the heartbeat's writes) but it listens.
        print(f"plaita: {instance!r} is not in the registry (expired?) but listens on its channel", file=sys.stderr)
        return instance
    raise AdminError(f"unknown worker instance {instance!r} (see `plaita workers`)")


def cmd_status(args: argparse.Namespace) -> int:
    q = _queue(args, fleet_partitions=not args.instance)
    if args.instance:
        instance = _resolve_instance(q.client, args.instance)
        reply_to = f"{fleet.REPLY_PREFIX}{uuid.uuid4().hex}"
        received = send_command(q.client, instance, "status", reply_to=reply_to, request_id=reply_to)
        if received == 0:
            raise AdminError(f"worker {instance!r} is registered but not listening (stopping or cut off?)")
        answer = fleet.wait_reply(q.client, reply_to, STATUS_REPLY_TIMEOUT_S)
        if answer is None:
            raise AdminError(f"worker {instance!r} did not answer within {STATUS_REPLY_TIMEOUT_S:.0f} s")
        status = answer["status"]
        if args.json:
            _emit(args, status, None, [])
        else:
            for key in sorted(k for k in status if k != "counters"):
                print(f"{key:>14}: {status[key]}")
            print(f"{'counters':>14}: {json.dumps(status.get('counters', {}))}")
        return 0
    stats = stream_stats_or_empty(q)
    stats["partitions_count"] = q.keyspace.partitions
    stats["partitions_from"] = args.partitions_from
    stats["problems"] = fleetcheck.check(q.client, q.keyspace, args.consumer_group)
    stats["executions"] = execution_counts(q.client, q.keyspace)
    stats["starts_waiting_for_slot"] = waiting_starts(q.client, q.keyspace)
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
    for key in ("length", "pending", "lag", "consumers", "oldest_pending_id", "oldest_pending_age_s", "dlq_length"):
        print(f"{key:>22}: {stats.get(key)}")
    print(f"{'partitions':>22}: {stats['partitions_count']} ({stats['partitions_from']})")
    if stats.get("note"):
        print(f"{'note':>22}: {stats['note']}")
    for line in stats["problems"]:
        print(f"{'problem':>22}: {line}")
    for part in stats.get("partitions", []):
        print(
            f"  {part['stream']}: length {part['length']}, pending {part['pending']}, lag {part['lag']}, "
            f"dlq {part['dlq_length']}"
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
    q = _queue(args)
    if args.all == bool(args.instance):
        raise AdminError("give exactly one of INSTANCE or --all")
    target = "all" if args.all else _resolve_instance(q.client, args.instance)
    received = send_command(q.client, target, args.command, now=getattr(args, "now", False))
    if received == 0:
        raise AdminError(f"no worker is listening on the control channel for {target!r}")
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
    return DLQ_ACTIONS[args.dlq_command](args, DeadLetterQueue(_queue(args)))


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
    except AdminError as exc:
        print(f"plaita {args.command}: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:
        return redis_failed(args.command, args.redis_url, exc)
