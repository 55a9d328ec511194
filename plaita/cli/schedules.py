"""``plaita schedules list``: each flow schedule, its next tick and its newest execution (and
whether it is paused); ``pause | resume | trigger | backfill``: ``plaita.cli.schedule_control``.

Reads only. The schedules are those of ``--flows MODULE`` (as a keeper runs them) and every
one a keeper recorded in Redis, so it works without the flow modules too. Exit codes: 0 done,
1 Redis failed (one line), 2 a bad ``--flows`` module or schedule (one line).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from plaita.cli import schedule_control
from plaita.cli.common import json_text, redis_failed
from plaita.cli.options import GroupMaker, flow_client_of

if TYPE_CHECKING:
    from plaita.flows.model.definition import Flow


def add_parsers(group: GroupMaker) -> None:
    sub = group(
        "schedules",
        help="list, pause, resume, trigger and backfill flow schedules",
        description="list | pause FLOW | resume FLOW | trigger FLOW | backfill FLOW --from ISO [--to ISO] "
        "(the Redis flags may follow the action too)",
    ).actions
    ls = sub.add_parser("list", help="each schedule: cron, time zone, policy, next tick, last execution")
    ls.add_argument("--flows", action="append", metavar="MODULE", default=[], help="also the schedules of MODULE")
    ls.add_argument("--json", action="store_true", help="print JSON")
    schedule_control.add_parsers(sub)


def run_schedules(args: argparse.Namespace) -> int:
    if args.schedules_command != "list":
        return schedule_control.run(args)
    from plaita.flows.model.definition import load_flows
    from plaita.flows.schedule_listing import schedule_rows

    registry: Iterable[Flow] = load_flows(args.flows) if args.flows else []  # ConfigError: exit 2, one line
    client = flow_client_of(args)
    try:
        rows = schedule_rows(registry, client.store, time.time())
    except Exception as exc:
        return redis_failed("schedules", args.redis_url, exc)
    finally:
        client.close()
    if args.json:
        print(json_text(rows, indent=2, ensure_ascii=False))
    else:
        _table(rows)
    return 0


def _table(rows: list[dict[str, Any]]) -> None:
    from plaita.flows.model.schedules import utc_text

    print(f"{'FLOW':16} {'CRON':16} {'TZ':16} {'MISSED':6} {'NEXT TICK (UTC)':20} LAST EXECUTION")
    for r in rows:
        if "error" in r:
            print(f"{r['flow']!s:16} {r['error']}", file=sys.stderr)
            continue
        last = f"{r['last_execution_id']} ({r['last_status']})" if r["last_execution_id"] else "-"
        flow = f"{r['flow']} (paused)" if r.get("paused") else r["flow"]
        print(f"{flow!s:16} {r['cron']!s:16} {r['tz']!s:16} {r['missed']!s:6} {utc_text(r['next_tick_s']):20} {last}")
    if not rows:
        print("(no schedules)")
