"""``plaita worker``, ``plaita enqueue`` and ``plaita diagram``: what each does once parsed."""

from __future__ import annotations

import argparse
import gc
import json
import sys
from pathlib import Path
from typing import Any

from plaita.cli.options import settings_from_args, tls_of
from plaita.cli.tracing import configure_tracing
from plaita.config import DEFAULT_REDIS_URL, Settings, environ, redact_url
from plaita.errors import ConfigError

#: Allocations between two young collections of a worker (CPython's default is 700).
YOUNG_GC_THRESHOLD = 7000


def run_worker(args: argparse.Namespace) -> int:
    """argv -> Settings -> ``plaita.ops.service.run_worker``: the wiring is the Python API's."""
    from plaita.ops.service import run_worker as run

    settings = settings_from_args(args)
    configure_tracing(args.otel, "plaita-worker", environ())
    # Everything imported so far lives as long as the process: frozen, the cyclic collector
    # stops re-scanning it every few thousand tasks (a full collection walks every object).
    gc.freeze()
    # A young collection walks every young object still alive (the tasks in flight, whatever
    # triggered it): at 700 allocations, one every ~100 no-op tasks cost ~4 % of their CPU.
    # Cycles are rare here (refcounting frees the rest), so ten times fewer collections lose nothing.
    gc.set_threshold(YOUNG_GC_THRESHOLD, *gc.get_threshold()[1:])
    return run(settings, handler=args.handler, flows=args.flows or (), keeper=args.keeper, tasks=args.tasks)


def run_enqueue(args: argparse.Namespace) -> int:
    from plaita.errors import BadTaskError
    from plaita.flows.tracing import parse_traceparent, producing
    from plaita.store.client import make_client
    from plaita.store.errors import is_redis_failure
    from plaita.store.streams.delayed import add_tasks, due_ms_of
    from plaita.store.streams.entries import ReplicationLagError
    from plaita.store.streams.partitioned import open_queue

    url = args.redis_url or DEFAULT_REDIS_URL
    settings = Settings(redis_url=url, queue_name=args.queue_name, partitions=int(args.partitions))
    lines = [args.body] if args.body is not None else [ln for ln in sys.stdin.read().splitlines() if ln.strip()]
    if not lines:
        raise ConfigError("no task given: pass a JSON object or pipe JSON lines on stdin")
    bodies = []
    for number, line in enumerate(lines, 1):
        try:
            bodies.append(_checked_body(json.loads(line)))
        except ValueError as exc:
            raise ConfigError(f"task {number} is not valid JSON: {exc}") from None
        except BadTaskError as exc:  # a non-object, no type: what every worker would dead-letter
            raise ConfigError(f"task {number}: {exc}") from None
    try:
        due_ms_of(args.delay_s, None, 0.0)
    except ValueError as exc:
        raise ConfigError(f"--delay-s: {exc}") from None
    if args.delay_s and args.wait_replicas:
        raise ConfigError("--wait-replicas applies to tasks added now, not with --delay-s")
    _stamp_priority(bodies, args.priority)
    env = environ()
    configure_tracing(args.otel, "plaita-enqueue", env)
    client = make_client(url, socket_timeout_s=5.0, tls=tls_of(args))
    q = open_queue(settings, client=client)
    try:
        # A script's trace context comes in $TRACEPARENT (the environment carrier of OpenTelemetry).
        with producing(bodies, q.keyspace.queue, parent=parse_traceparent(env.get("TRACEPARENT"))):
            if args.delay_s:
                ids = add_tasks(q, bodies, delay_s=args.delay_s, priority=args.priority)
            else:
                ids = q.enqueue_many(
                    bodies,
                    wait_replicas=args.wait_replicas,
                    wait_timeout_ms=args.wait_timeout_ms,
                    priority=args.priority,
                )
        for message_id in ids:
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


def _stamp_priority(bodies: list[dict[str, Any]], priority: int) -> None:
    """A named task's body carries its level: its retries read it there and go back to it."""
    for body in bodies:
        if priority and body.get("type") not in ("start", "resume"):
            body["priority"] = priority


def _checked_body(body: object) -> dict[str, Any]:
    """``body`` if some worker can run it, else BadTaskError: a ``start`` or ``resume`` body is
    checked as every worker checks it; another string ``type`` is a named task's (for a ``--tasks``
    worker, which dead-letters a name it does not know), checked as that worker parses it."""
    from plaita.tasking.registry import parse_call
    from plaita.tasks import TASK_TYPES, validate_body

    checked = validate_body(body, named=True)
    if checked["type"] not in TASK_TYPES:
        parse_call(checked, "-")
    return checked


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
