"""``plaita schedules pause | resume | trigger | backfill FLOW``: schedules at run time.

Exit codes: 0 done (``pause`` of a paused one, ``resume`` of a running one: said so, 0 too),
1 no such schedule or Redis failed (one line), 2 bad flags (a bad time, a range over
``--max-ticks`` ticks). ``backfill --json`` prints each tick and whether it was started.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from plaita.cli.common import json_text, redis_failed
from plaita.cli.options import WithParents, flow_client_of
from plaita.errors import ConfigError, PlaitaError

if TYPE_CHECKING:
    from plaita.flows.model.definition import Flow

ACTIONS = ("pause", "resume", "trigger", "backfill")


def iso_time_s(raw: str) -> float:
    """An argparse type: an ISO 8601 time (``2026-12-01T09:00``, a zone or ``Z`` optional: UTC)."""
    try:
        when = datetime.datetime.fromisoformat(raw.strip().replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO 8601 time: {raw!r} (2026-12-01T09:00:00Z)") from None
    return (when if when.tzinfo else when.replace(tzinfo=datetime.UTC)).timestamp()


def add_parsers(sub: WithParents) -> None:
    flows_help = "the flows' module (else the schedule recorded for the queue is used)"
    for action, what in (
        ("pause", "stop starting its ticks (kept in Redis; the ticks that pass are not started later)"),
        ("resume", "start its ticks again, from the next one"),
        ("trigger", "start one execution now, outside the schedule"),
        ("backfill", "start each tick between --from and --to that has not run (once: the tick's dedup key)"),
    ):
        p = sub.add_parser(action, help=what)
        p.add_argument("flow", help="flow id")
        p.add_argument("--flows", action="append", metavar="MODULE", default=[], help=flows_help)
        p.add_argument("--json", action="store_true", help="print JSON")
        if action == "backfill":
            p.add_argument("--from", dest="from_s", type=iso_time_s, required=True, metavar="ISO", help="first time")
            p.add_argument("--to", dest="to_s", type=iso_time_s, metavar="ISO", help="last time (default: now)")
            p.add_argument("--max-ticks", type=int, default=100, help="refuse more ticks than this (%(default)s)")
            p.add_argument("--dry-run", action="store_true", help="list the ticks, start nothing")


def run(args: argparse.Namespace) -> int:
    from plaita.flows.model.definition import load_flows
    from plaita.flows.schedule_control import ScheduleControl, TooManyTicks

    loaded: Iterable[Flow] = load_flows(args.flows) if args.flows else []  # ConfigError: exit 2, one line
    flows = flow_client_of(args)
    try:
        return _ACTIONS[args.schedules_command](ScheduleControl(flows, loaded), args)
    except (TooManyTicks, ValueError) as exc:
        print(f"plaita schedules {args.schedules_command}: {exc}", file=sys.stderr)
        return 2
    except PlaitaError as exc:
        print(f"plaita schedules {args.schedules_command}: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:
        return redis_failed("schedules", args.redis_url, exc)
    finally:
        flows.close()


def _say(args: argparse.Namespace, doc: dict[str, Any], text: str) -> int:
    print(json_text(doc) if args.json else text)
    return 0


def _pause(control: Any, args: argparse.Namespace) -> int:
    changed = control.pause(args.flow)
    text = f"schedule of {args.flow} paused" if changed else f"schedule of {args.flow} was paused already"
    return _say(args, {"flow": args.flow, "paused": True, "changed": changed}, text)


def _resume(control: Any, args: argparse.Namespace) -> int:
    changed = control.resume(args.flow)
    text = f"schedule of {args.flow} resumed" if changed else f"schedule of {args.flow} was not paused"
    return _say(args, {"flow": args.flow, "paused": False, "changed": changed}, text)


def _trigger(control: Any, args: argparse.Namespace) -> int:
    eid = control.trigger(args.flow)
    return _say(args, {"flow": args.flow, "execution_id": eid}, f"execution {eid} of {args.flow} started")


def _backfill(control: Any, args: argparse.Namespace) -> int:
    import time

    if args.max_ticks < 1:
        raise ConfigError("--max-ticks must be at least 1")
    to_s = args.to_s if args.to_s is not None else time.time()
    ticks = control.backfill(args.flow, args.from_s, to_s, max_ticks=args.max_ticks, dry_run=args.dry_run)
    if args.json:
        rows = [{"tick_s": t.tick_s, "execution_id": t.execution_id, "started": t.started} for t in ticks]
        print(json_text({"flow": args.flow, "dry_run": bool(args.dry_run), "ticks": rows}))
        return 0
    verb = "would start" if args.dry_run else "started"
    for t in ticks:
        print(f"  {t.execution_id}  {verb if t.started else 'ran already'}")
    started = sum(t.started for t in ticks)
    print(f"{args.flow}: {len(ticks)} tick(s) in range, {started} {verb}, {len(ticks) - started} ran already")
    return 0


_ACTIONS = {"pause": _pause, "resume": _resume, "trigger": _trigger, "backfill": _backfill}
