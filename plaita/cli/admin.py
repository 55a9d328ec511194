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

import redis

from plaita.config import DEFAULT_REDIS_URL, Settings, redact_url
from plaita.ops.control import control_channel, send_command
from plaita.ops.registry import list_workers, registry_key
from plaita.store.streams import DeadLetterQueue, StreamQueue, make_client

#: Seconds ``plaita status INSTANCE`` waits for the worker's answer.
STATUS_REPLY_TIMEOUT_S = 5.0
#: Socket timeout of the admin client: above the reply wait, so a worker that does not answer
#: (stopped, frozen) is reported as such and not as a Redis timeout.
ADMIN_SOCKET_TIMEOUT_S = STATUS_REPLY_TIMEOUT_S + 2.0
#: A stream entry id as Redis prints it (``ms-seq``; a bare ``ms`` is accepted too).
STREAM_ID = re.compile(r"\d+(-\d+)?")


class AdminError(Exception):
    """Raised for an operator mistake (exit 1 with the message)."""


def _queue(args: argparse.Namespace) -> StreamQueue:
    url = args.redis_url or DEFAULT_REDIS_URL
    settings = Settings(
        redis_url=url,
        queue_name=args.queue_name,
        consumer_group=args.consumer_group,
        consumer_name="plaita-admin",
        dlq_key=getattr(args, "dlq_key", "") or "",
    )
    return StreamQueue.from_settings(settings, client=make_client(url, socket_timeout_s=ADMIN_SOCKET_TIMEOUT_S))


def _print_table(rows: list[dict[str, Any]], columns: Sequence[str]) -> None:
    cells = [[str(r.get(c, "")) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    print("  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip())
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())


def _emit(args: argparse.Namespace, data: Any, rows: list[dict[str, Any]] | None, columns: Sequence[str]) -> None:
    if getattr(args, "json", False):
        print(json.dumps(data, indent=2, sort_keys=True, default=str))
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


def cmd_workers(args: argparse.Namespace) -> int:
    q = _queue(args)
    now = time.time()
    workers = list_workers(q.client)
    rows = [
        {
            "instance": w.get("instance_id"),
            "host": w.get("host"),
            "state": w.get("state"),
            "since": _age(now - float(w["state_since"])) if w.get("state_since") else "-",
            "in_flight": w.get("in_flight"),
            "processed": w.get("processed"),
            "failed": w.get("failed"),
            "last_error": (w.get("last_error") or "")[:60],
            "heartbeat_age": _age(now - float(w["last_heartbeat"])) if w.get("last_heartbeat") else "-",
        }
        for w in workers
    ]
    columns = ["instance", "host", "state", "since", "in_flight", "processed", "failed", "last_error", "heartbeat_age"]
    _emit(args, workers, rows, columns)
    return 0


def _resolve_instance(client: redis.Redis, instance: str) -> str:
    if client.exists(registry_key(instance)):
        return instance
    for w in list_workers(client):  # also accept a consumer name
        if w.get("consumer") == instance:
            return str(w["instance_id"])
    # A worker whose registry entry expired (heartbeats refused: OOM, ACL) may still listen.
    channel = control_channel(instance)
    listeners = dict(client.pubsub_numsub(channel))
    if int(listeners.get(channel.encode(), listeners.get(channel, 0)) or 0) > 0:
        print(f"plaita: {instance!r} is not in the registry (entry expired?) but listens on {channel}", file=sys.stderr)
        return instance
    raise AdminError(f"unknown worker instance {instance!r} (see `plaita workers`)")


def cmd_status(args: argparse.Namespace) -> int:
    q = _queue(args)
    if args.instance:
        instance = _resolve_instance(q.client, args.instance)
        reply_to = f"plaita:control:reply:{uuid.uuid4().hex}"
        received = send_command(q.client, instance, "status", reply_to=reply_to, request_id=reply_to)
        if received == 0:
            raise AdminError(f"worker {instance!r} is registered but not listening (stopping or cut off?)")
        answer = q.client.blpop([reply_to], timeout=STATUS_REPLY_TIMEOUT_S)
        if answer is None:
            raise AdminError(f"worker {instance!r} did not answer within {STATUS_REPLY_TIMEOUT_S:.0f} s")
        status = json.loads(answer[1])["status"]
        if args.json:
            _emit(args, status, None, [])
        else:
            for key in sorted(k for k in status if k != "counters"):
                print(f"{key:>14}: {status[key]}")
            print(f"{'counters':>14}: {json.dumps(status.get('counters', {}))}")
        return 0
    stats = _stream_stats(q)
    if args.json:
        _emit(args, stats, None, [])
        return 0
    print(f"stream {stats['stream']}  group {stats['group']}")
    for key in ("length", "pending", "lag", "consumers", "oldest_pending_id", "oldest_pending_age_s", "dlq_length"):
        print(f"{key:>22}: {stats.get(key)}")
    if stats.get("note"):
        print(f"{'note':>22}: {stats['note']}")
    return 0


def _stream_stats(q: StreamQueue) -> dict[str, Any]:
    """``stream_stats``, or zeros when the stream or its group does not exist yet (no worker ran)."""
    try:
        return q.stream_stats()
    except redis.ResponseError as exc:
        if "no such key" not in str(exc) and "NOGROUP" not in str(exc):
            raise
    exists = bool(q.client.exists(q.stream))
    groups = q.client.xinfo_groups(q.stream) if exists else []
    group = next((g for g in groups if str(g.get("name", b""), "utf-8", "replace") == q.group), None)
    return {
        "stream": q.stream,
        "group": q.group,
        "length": int(q.client.xlen(q.stream)) if exists else 0,
        "pending": int(group.get("pending", 0) or 0) if group else 0,
        "lag": group.get("lag") if group else None,
        "consumers": int(group.get("consumers", 0) or 0) if group else 0,
        "dlq_length": int(q.client.xlen(q.dlq_key)),
        "oldest_pending_id": None,
        "oldest_pending_age_s": 0.0,
        "note": "stream does not exist yet" if not exists else f"group {q.group!r} does not exist yet",
    }


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


def cmd_dlq(args: argparse.Namespace) -> int:
    dlq = DeadLetterQueue(_queue(args))
    action = args.dlq_command
    if action == "list":
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
    if action == "show":
        _check_ids([args.id])
        row = dlq.get(args.id)
        if row is None:
            raise AdminError(f"no dead letter with id {args.id!r} in {dlq.queue.dlq_key}")
        print(json.dumps(row, indent=2, sort_keys=True, ensure_ascii=False))
        return 0
    if action == "requeue":
        ids = dlq.all_ids() if args.all else list(args.ids)
        _check_ids(ids)
        if not ids:
            raise AdminError("nothing to requeue: give DLQ ids or --all (see `plaita dlq list`)")
        try:
            moved = dlq.requeue(ids)
        except KeyError as exc:
            raise AdminError(f"no dead letter with id {exc.args[0]!r} in {dlq.queue.dlq_key}") from None
        _emit(
            args,
            [{"dlq_id": a, "new_id": b} for a, b in moved],
            [{"dlq_id": a, "new_id": b} for a, b in moved],
            ["dlq_id", "new_id"],
        )
        return 0
    # purge
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
    except redis.RedisError as exc:
        url = redact_url(args.redis_url or DEFAULT_REDIS_URL)
        print(f"plaita {args.command}: Redis at {url} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
