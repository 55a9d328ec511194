"""What ``plaita executions list`` reads: ``FlowClient.list`` (``plaita.flows.producer.listing``),
page after page until ``--limit`` rows, of one tenant or, with ``--all-tenants``, of the default
tenant and every tenant with executions; ``--cursor`` goes on where an earlier list stopped (the
cursor is on stderr when more rows follow). And ``plaita executions steps ID``: ``FlowClient.steps``.
Reads only."""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

from plaita.cli.common import json_text
from plaita.cli.options import WithParents
from plaita.cli.retention import duration_s
from plaita.flows.producer.listing import MAX_LIMIT as PAGE
from plaita.flows.producer.listing import ExecutionRow

#: Most rows ``--limit`` may ask for.
MAX_LIMIT = 100_000
#: Most index entries one command reads (calls that stop at their own bound are continued up to it).
MAX_SCANNED = 200_000

_AGO = re.compile(r"\d+(?:\.\d+)?[smhdw]")


@dataclass
class Listed:
    """The rows one command lists, the unreadable keys it met, and where a next one goes on."""

    rows: list[ExecutionRow] = field(default_factory=list)
    bad: list[Any] = field(default_factory=list)
    cursor: str | None = None
    capped: bool = False


def list_rows(flows: Any, args: argparse.Namespace) -> Listed:
    """Up to ``args.limit`` rows matching the command's filters, newest update first."""
    listed = Listed(cursor=args.cursor)
    scanned = 0
    while len(listed.rows) < args.limit:
        page = flows.list(
            status=args.status,
            flow=args.flow,
            all_tenants=args.all_tenants,
            parent_id=args.parent,
            created_after=args.created_after,
            created_before=args.created_before,
            version=args.version,
            limit=min(PAGE, args.limit - len(listed.rows)),
            cursor=listed.cursor,
        )
        listed.rows += page.rows
        listed.bad += page.unreadable
        listed.cursor, scanned = page.cursor, scanned + page.scanned
        if listed.cursor is None:
            break
        if scanned >= MAX_SCANNED:
            listed.capped = True
            break
    return listed


def moment_s(raw: str) -> float:
    """An argparse type: an ISO 8601 date or time (UTC unless it says), epoch seconds, or a
    duration ago (``7d``, ``12h``, ``30m``: that long before now)."""
    text = raw.strip()
    if _AGO.fullmatch(text):
        return time.time() - duration_s(text)
    try:
        return float(text)
    except ValueError:
        pass
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a time: {raw!r} (ISO 8601 such as 2026-01-31T12:00, epoch seconds, or ago: 7d, 12h)"
        ) from None
    return (when if when.tzinfo else when.replace(tzinfo=datetime.UTC)).timestamp()


def summary(row: ExecutionRow, *, tenant: bool) -> dict[str, Any]:
    """A row as ``--json`` prints it (``tenant`` with ``--all-tenants``: ``default`` for the default one)."""
    out = {
        "execution_id": row.execution_id,
        "flow_id": row.flow_id,
        "status": row.status,
        "step": row.step,
        "steps_run": row.steps_run,
        "version": row.version,
        "parent_id": row.parent_id,
        "created_at": row.created_at,
        "updated_at": row.updated_at,
        "ended_at": row.ended_at,
    }
    if tenant:
        out["tenant"] = row.tenant or "default"
    return out


def number_or_zero(value: Any) -> float:
    """A timestamp field as a float; 0 for anything that is not a number (sorted last)."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


def add_steps_parser(sub: WithParents) -> None:
    st = sub.add_parser("steps", help="each step an execution ran: attempts, start, end, last error")
    st.add_argument("id", help="execution id")
    st.add_argument("--output", action="store_true", help="each step's output too")
    st.add_argument("--json", action="store_true", help="print JSON")


def run_steps(flows: Any, args: argparse.Namespace) -> int:
    """ExecutionNotFound (exit 1, one line) when there is no execution."""
    steps = flows.steps(args.id, include_output=args.output)
    if args.json:
        print(json_text([dataclasses.asdict(s) for s in steps], indent=2, ensure_ascii=False))
        return 0
    print(f"{'STEP':18} {'ATTEMPTS':>8} {'OUTCOME':10} {'STARTED':19} {'ENDED':19} ERROR")
    for s in steps:
        when = f"{_when(s.started_at):19} {_when(s.ended_at):19}"
        print(f"{s.name:18} {s.attempts:>8} {s.outcome:10} {when} {s.error or ''}")
        if args.output:
            print(f"  output {json.dumps(s.output, ensure_ascii=False)[:500]}")
    if not steps:
        print("(no steps run yet)")
    return 0


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    try:
        return datetime.datetime.fromtimestamp(ts, tz=datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")
    except (OverflowError, OSError, ValueError):  # out of the calendar's range, or NaN
        return repr(ts)
