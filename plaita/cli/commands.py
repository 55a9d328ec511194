"""``plaita worker``, ``plaita enqueue`` and ``plaita diagram``: what each does once parsed."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from plaita.cli.options import settings_from_args, tls_of
from plaita.config import DEFAULT_REDIS_URL, Settings, redact_url
from plaita.errors import ConfigError

logger = logging.getLogger("plaita.cli")


def run_worker(args: argparse.Namespace) -> int:
    from plaita.ops.operations import attach_operations
    from plaita.runtime.handlers import load_handler
    from plaita.runtime.worker import Worker

    settings = settings_from_args(args)
    check_status_file(settings.status_file)
    runner = None
    if args.flows or args.keeper:
        from plaita.cli.executions import flow_worker

        settings, runner = flow_worker(args.flows or [], settings, keeper=args.keeper)
        runner.handover.group = settings.consumer_group  # hand over only to workers of our group
        # Steps run as coroutines on the async pool's loop; sync steps move to threads there.
        handler: object = runner.run_async
    elif args.handler:
        handler = load_handler(args.handler)
    else:
        # A default handler would silently consume (and ack) whatever the queue carries.
        raise ConfigError(
            "plaita worker needs --handler MODULE:CALLABLE or --flows MODULE (e.g. --handler "
            "plaita.runtime.handlers:echo to log and ack every task)"
        )
    worker = Worker(settings, handler)  # type: ignore[arg-type]
    ops = attach_operations(worker)  # binds --metrics-port: ConfigError (exit 2) when it cannot listen
    if runner is not None:
        runner.add_observer(worker.observers)  # execution metrics and the in-flight count
        ops.track_executions()
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


def check_status_file(path: str | None) -> None:
    """ConfigError unless the status file can be written (its directory exists and is writable)."""
    if not path:
        return
    probe = Path(path).with_name(f".{Path(path).name}.plaita-probe")
    try:
        probe.write_text("", encoding="utf-8")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(f"--status-file {path}: cannot write there ({exc.strerror or exc})") from None


def _run_owner(worker: Any) -> None:
    try:
        worker.run()
    except Exception:  # a bug, not a Redis failure: say so loudly, still exit cleanly
        logger.critical("worker loop crashed (a plaita bug; please report it)", exc_info=True)


def run_enqueue(args: argparse.Namespace) -> int:
    from plaita.store.client import make_client
    from plaita.store.entries import ReplicationLagError
    from plaita.store.errors import is_redis_failure
    from plaita.store.partitioned import open_queue
    from plaita.tasks import validate_body

    url = args.redis_url or DEFAULT_REDIS_URL
    settings = Settings(redis_url=url, queue_name=args.queue_name, partitions=int(args.partitions))
    lines = [args.body] if args.body is not None else [ln for ln in sys.stdin.read().splitlines() if ln.strip()]
    if not lines:
        raise ConfigError("no task given: pass a JSON object or pipe JSON lines on stdin")
    bodies = []
    for number, line in enumerate(lines, 1):
        try:
            bodies.append(validate_body(json.loads(line)))
        except ValueError as exc:
            raise ConfigError(f"task {number} is not valid JSON: {exc}") from None
    client = make_client(url, socket_timeout_s=5.0, tls=tls_of(args))
    q = open_queue(settings, client=client)
    try:
        for message_id in q.enqueue_many(
            bodies, wait_replicas=args.wait_replicas, wait_timeout_ms=args.wait_timeout_ms
        ):
            print(message_id)
    except ReplicationLagError as exc:
        print("\n".join(exc.ids))
        print(f"plaita enqueue: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:
        if not is_redis_failure(exc):
            raise
        print(f"plaita enqueue: Redis at {redact_url(url)} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    finally:
        client.close()
    return 0


def run_diagram(args: argparse.Namespace) -> int:
    from plaita.fsm.diagram import stale_files, write_files

    root = Path(args.root)
    try:
        if args.check:
            stale = stale_files(root)
            for path in stale:
                print(f"stale: {path} does not match plaita/fsm/table.py; run `plaita diagram`", file=sys.stderr)
            return 1 if stale else 0
        for path in write_files(root):
            print(f"wrote {path}")
    except ValueError as exc:  # README.md without its diagram markers
        print(f"plaita diagram: {exc}", file=sys.stderr)
        return 1
    return 0
