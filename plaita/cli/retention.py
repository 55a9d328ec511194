"""``plaita executions delete | prune | cancel-many | resume-many``: retention and bulk steering.

``delete ID…`` removes ended executions and every key they own (``--force``: a running one is
cancelled first, and said so). ``prune --ended-before DURATION`` deletes the ended executions of
one tenant (``--tenant``; every tenant with ``--all-tenants``) in bounded batches, resumable by
running it again. ``cancel-many`` cancels the executions a status and flow filter selects, after
a confirmation (``--yes`` skips it; ``--dry-run`` lists them). Exit codes: 0 done, 1 refused or
Redis failed, 2 bad flags (or a confirmation needed where no one can answer it).
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Callable
from typing import Any

from plaita.cli.common import json_arg, json_text
from plaita.cli.options import WithParents
from plaita.errors import ConfigError

_UNITS_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw]?)")


def duration_s(raw: str) -> float:
    """An argparse type: ``90``, ``90s``, ``15m``, ``12h``, ``7d``, ``2w`` as seconds."""
    m = _DURATION.fullmatch(raw.strip())
    if m is None:
        raise argparse.ArgumentTypeError(f"not a duration: {raw!r} (a number with s, m, h, d or w: 7d, 12h)")
    return float(m.group(1)) * _UNITS_S[m.group(2) or "s"]


def add_parsers(sub: WithParents) -> None:
    """The subcommands on ``plaita executions``'s subparsers."""
    dl = sub.add_parser("delete", help="delete ended executions and every key they own")
    dl.add_argument("ids", nargs="+", metavar="ID", help="execution id")
    dl.add_argument("--force", action="store_true", help="cancel a queued, running or suspended one first")
    dl.add_argument("--timeout-s", type=float, default=60.0, help="longest wait for a --force cancel to land")
    dl.add_argument("--json", action="store_true", help="print JSON")
    pr = sub.add_parser("prune", help="delete the executions that ended before a time (bounded batches)")
    pr.add_argument("--ended-before", type=duration_s, required=True, metavar="DURATION", help="ago: 7d, 12h, 30m")
    pr.add_argument("--status", action="append", choices=["completed", "error", "cancelled"], help="only this")
    pr.add_argument("--dry-run", action="store_true", help="count them, delete nothing")
    pr.add_argument("--limit", type=int, help="delete at most this many (run again to go on)")
    pr.add_argument("--all-tenants", action="store_true", help="the default tenant's and every tenant's")
    pr.add_argument("--json", action="store_true", help="print JSON")
    cm = sub.add_parser("cancel-many", help="cancel every execution a filter selects (asks first)")
    _many_flags(cm, "cancel", ["queued", "running", "suspended"])
    rm = sub.add_parser("resume-many", help="resume every suspended execution a filter selects (asks first)")
    _many_flags(rm, "resume", ["suspended"])
    rm.add_argument("--wait", metavar="NAME", help="only those in the wait NAME (ctx.suspend(wait_for=NAME)); "
                    "the event is addressed to it")  # fmt: skip
    rm.add_argument("--data", help="the event's data as JSON")


def _many_flags(parser: argparse.ArgumentParser, verb: str, statuses: list[str]) -> None:
    """The filter and confirmation flags ``cancel-many`` and ``resume-many`` share."""
    parser.add_argument("--status", action="append", choices=statuses, help="only this (repeatable)")
    parser.add_argument("--flow", help="only this flow")
    parser.add_argument("--limit", type=int, default=1000, help="at most this many (default %(default)s)")
    parser.add_argument("--dry-run", action="store_true", help=f"list them, {verb} nothing")
    parser.add_argument("--yes", action="store_true", help="do not ask for a confirmation")
    parser.add_argument("--all-tenants", action="store_true", help="the default tenant's and every tenant's")
    parser.add_argument("--json", action="store_true", help="print JSON")


def run_delete(flows: Any, args: argparse.Namespace) -> int:
    done = flows.delete(*args.ids, force=args.force, timeout_s=args.timeout_s)
    if args.json:
        print(json_text([{"execution_id": d.execution_id, "outcome": d.outcome, "status": d.status} for d in done]))
        return 0
    for d in done:
        if d.outcome == "cancelled_and_deleted":
            print(f"execution {d.execution_id} was {d.status}: cancelled (--force), then deleted")
        elif d.outcome == "deleted":
            print(f"execution {d.execution_id} ({d.status}) deleted")
        else:
            print(f"execution {d.execution_id}: no document (its leftover keys, if any, deleted)")
    return 0


def run_prune(flows: Any, args: argparse.Namespace) -> int:
    if args.limit is not None and args.limit < 1:
        raise ConfigError("--limit must be at least 1")
    before_s = time.time() - args.ended_before
    statuses = tuple(args.status or ("completed", "error", "cancelled"))
    rows = []
    for tenant in _tenants(flows, args):
        done = flows.for_tenant(tenant or None).prune(
            before_s, statuses=statuses, dry_run=args.dry_run, limit=args.limit
        )
        rows.append(
            {
                "tenant": tenant,
                "matched": done.matched,
                "deleted": len(done.deleted),
                "more": done.more,
                "kept": done.kept,
            }
        )
    if args.json:
        print(json_text(rows))
        return 0
    for r in rows:
        who = f"tenant {r['tenant']}" if r["tenant"] else "default tenant"
        if args.dry_run:
            print(f"{who}: {r['matched']} execution(s) ended before then; nothing deleted (--dry-run)")
            continue
        more = " (more left: run it again)" if r["more"] else ""
        print(f"{who}: {r['deleted']} execution(s) deleted{more}")
        for eid in r["kept"][:20]:
            print(f"  kept {eid}: unreadable, or running again", file=sys.stderr)
    return 0


def check_flags(args: argparse.Namespace) -> None:
    """ConfigError (exit 2) for flags of ``cancel-many`` and ``resume-many`` that cannot work,
    before anything connects."""
    if args.executions_command not in ("cancel-many", "resume-many"):
        return
    if args.limit < 1:
        raise ConfigError("--limit must be at least 1")
    if args.all_tenants and args.tenant is not None:
        raise ConfigError("--all-tenants selects in every tenant: give it without --tenant")
    if args.executions_command == "resume-many":
        json_arg(args.data, "--data")


def run_cancel_many(flows: Any, args: argparse.Namespace) -> int:
    statuses = tuple(args.status or ("queued", "running", "suspended"))
    which = "/".join(statuses) + (f" of flow {args.flow}" if args.flow else "")
    return _run_many(
        flows, args, ("cancel", "cancelled"), which, lambda f, dry: f.cancel_many(statuses, args.flow, **dry)
    )


def run_resume_many(flows: Any, args: argparse.Namespace) -> int:
    data = json_arg(args.data, "--data")
    which = (
        "suspended"
        + (f" of flow {args.flow}" if args.flow else "")
        + (f" waiting for {args.wait}" if args.wait else "")
    )

    def call(f: Any, dry: dict[str, Any]) -> list[str]:
        return list(
            f.resume_many(args.flow, wait_for=args.wait, data=data, statuses=tuple(args.status or ["suspended"]), **dry)
        )

    return _run_many(flows, args, ("resume", "resumed"), which, call)


def _run_many(
    flows: Any,
    args: argparse.Namespace,
    verbs: tuple[str, str],
    which: str,
    call: Callable[[Any, dict[str, Any]], list[str]],
) -> int:
    """Select with a dry run in every tenant asked for, then (confirmed, or ``--yes``) act:
    ``call(client, {"dry_run": …, "limit": …})`` cancels or resumes one tenant's selection;
    ``verbs``: what it does, and what it did ("cancel", "cancelled")."""
    verb, did = verbs
    clients = [flows.for_tenant(t or None) for t in _tenants(flows, args)]
    found = {c.tenant_id or "": call(c, {"dry_run": True, "limit": args.limit}) for c in clients}
    n = sum(len(ids) for ids in found.values())
    if args.dry_run or not n:
        _print_ids(found, args, f"would {verb}" if n else f"nothing to {verb}")
        return 0
    if not args.yes and not _confirmed(f"{verb}-many", f"{verb} {n} {which} execution(s)"):
        print(f"plaita executions {verb}-many: not confirmed; nothing done", file=sys.stderr)
        return 2 if not sys.stdin.isatty() else 1
    done = {c.tenant_id or "": call(c, {"limit": args.limit}) for c in clients}
    _print_ids(done, args, did)
    return 0


def _tenants(flows: Any, args: argparse.Namespace) -> list[str]:
    """The tenants a command acts in: this client's, or ("" first) every one (``--all-tenants``)."""
    return ["", *flows.store.tenants()] if args.all_tenants else [flows.tenant_id or ""]


def _print_ids(ids: dict[str, list[str]], args: argparse.Namespace, what: str) -> None:
    """The ids per tenant ("" the default one); JSON keeps the one-tenant shape (``execution_ids``)
    and adds ``tenants`` with ``--all-tenants``."""
    every = [eid for per in ids.values() for eid in per]
    if args.json:
        out: dict[str, Any] = {"dry_run": bool(args.dry_run), "execution_ids": every}
        if args.all_tenants:
            out["tenants"] = ids
        print(json_text(out))
        return
    print(f"{what}: {len(every)} execution(s)" if every else what)
    for tenant, per in ids.items():
        for eid in per:
            print(f"  {eid}" + (f"  (tenant {tenant})" if tenant else ""))


def _confirmed(command: str, question: str) -> bool:
    """Ask on the terminal; without one (a script, a pipe) there is no answer: --yes is needed."""
    if not sys.stdin.isatty():
        print(f"plaita executions {command}: no terminal to confirm on: pass --yes (or --dry-run)", file=sys.stderr)
        return False
    answer = input(f"{question}? type yes: ")
    return answer.strip().lower() == "yes"


COMMANDS: dict[str, Callable[[Any, argparse.Namespace], int]] = {
    "delete": run_delete,
    "prune": run_prune,
    "cancel-many": run_cancel_many,
    "resume-many": run_resume_many,
}
