"""``plaita limits set FLOW … | clear FLOW | show [FLOW]``: a flow's fleet-wide limits at run time.

``set`` overrides limits the flow declares (``--max-concurrent``, ``--max-starts-per-s``,
``--per-key`` for ``max_concurrent_per_key``); every worker obeys it at its next acquire, release
or sweep, without a restart (``plaita.flows.limit_control``). ``clear`` drops the overrides;
``show`` lists them with each flow's running and parked counts. Exit codes: 0 done, 1 Redis
failed (one line), 2 bad flags (``set`` without a limit, a limit below 1).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from plaita.cli.common import json_text, redis_failed
from plaita.cli.options import GroupMaker, flow_client_of
from plaita.config import DEFAULT_LEASE_TTL_S


def _at_least_1(raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an int: {raw!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _rate(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {raw!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {raw}")
    return value


def add_parsers(group: GroupMaker) -> None:
    sub = group(
        "limits",
        help="change a flow's fleet-wide limits at run time (no restart)",
        description="set FLOW [--max-concurrent N] [--max-starts-per-s R] [--per-key N] | clear FLOW | "
        "show [FLOW] (the Redis flags may follow the action too)",
    ).actions
    st = sub.add_parser("set", help="override limits the flow declares; every worker obeys at once")
    st.add_argument("flow", help="flow id")
    st.add_argument("--max-concurrent", type=_at_least_1, metavar="N", help="executions running at once")
    st.add_argument("--max-starts-per-s", type=_rate, metavar="R", help="starts per second")
    st.add_argument("--per-key", type=_at_least_1, metavar="N", help="executions per concurrency key at once")
    st.add_argument(
        "--lease-ttl-seconds",
        type=float,
        default=DEFAULT_LEASE_TTL_S,
        help="the workers' lease ttl: how long a slot reserved for a parked start lives (%(default)s)",
    )
    st.add_argument("--json", action="store_true", help="print JSON")
    cl = sub.add_parser("clear", help="drop the overrides: the declared limits hold again")
    cl.add_argument("flow", help="flow id")
    cl.add_argument("--json", action="store_true", help="print JSON")
    sh = sub.add_parser("show", help="overrides, running and parked counts, per flow")
    sh.add_argument("flow", nargs="?", help="flow id (default: every flow with overrides or parked starts)")
    sh.add_argument("--json", action="store_true", help="print JSON")


def run_limits(args: argparse.Namespace) -> int:
    from plaita.flows.limit_control import LimitControl

    if args.limits_command == "set" and None is args.max_concurrent is args.max_starts_per_s is args.per_key:
        print("plaita limits set: give --max-concurrent, --max-starts-per-s or --per-key (see --help)", file=sys.stderr)
        return 2
    flows = flow_client_of(args)
    try:
        control = LimitControl(flows, ttl_s=getattr(args, "lease_ttl_seconds", DEFAULT_LEASE_TTL_S))
        return _ACTIONS[args.limits_command](control, args)
    except Exception as exc:
        return redis_failed("limits", args.redis_url, exc)
    finally:
        flows.close()


def _set(control: Any, args: argparse.Namespace) -> int:
    given = {"max_concurrent": args.max_concurrent, "max_starts_per_s": args.max_starts_per_s}
    given["max_concurrent_per_key"] = args.per_key
    control.set(args.flow, **given)
    given = {k: v for k, v in given.items() if v is not None}
    if args.json:
        print(json_text({"flow_id": args.flow, **given}))
    else:
        print(f"limits of {args.flow} set: " + ", ".join(f"{k}={v}" for k, v in given.items()))
    return 0


def _clear(control: Any, args: argparse.Namespace) -> int:
    cleared = control.clear(args.flow)
    if args.json:
        print(json_text({"flow_id": args.flow, "cleared": cleared}))
    else:
        print(f"limits of {args.flow} cleared" if cleared else f"{args.flow} had no limits set")
    return 0


def _show(control: Any, args: argparse.Namespace) -> int:
    rows = control.show(args.flow)
    if args.json:
        print(json_text(rows if args.flow is None else rows[0]))
        return 0
    print(f"{'FLOW':20} {'MAX_CONCURRENT':>14} {'STARTS/S':>9} {'PER_KEY':>8} {'RUNNING':>8} {'WAITING':>8}")
    for r in rows:
        cells = [("-" if r[k] is None else str(r[k])) for k in ("max_concurrent", "max_starts_per_s")]
        per_key = "-" if r["max_concurrent_per_key"] is None else str(r["max_concurrent_per_key"])
        print(f"{r['flow_id']:20} {cells[0]:>14} {cells[1]:>9} {per_key:>8} {r['running']:>8} {r['waiting']:>8}")
    if not rows:
        print("(no flow has limits set or starts waiting)")
    return 0


_ACTIONS = {"set": _set, "clear": _clear, "show": _show}
