"""``plaita executions start | resume | send | cancel | retry | list | show``.

``--tenant T`` makes every action about tenant ``T``'s executions (its key namespace
``plaita:T:…``; ``list`` reads that tenant's status index).

Exit codes: 0 done, 1 unknown or unreadable execution, a Redis failure or a wait that timed
out (one line on stderr), 2 bad arguments; ``cancel`` 3 when the execution had already ended
``completed`` or ``error`` (nothing was cancelled). Read commands (``list``, ``show``, ``steps``) never write;
``list`` names each unreadable execution key on stderr and lists the others.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

from plaita.cli import listing, retention
from plaita.cli.common import json_arg, json_text, redis_failed
from plaita.cli.listing import MAX_LIMIT, MAX_SCANNED, list_rows, moment_s, number_or_zero, summary
from plaita.cli.options import GroupMaker, WithParents, add_priority_option, flow_client_of, seconds
from plaita.errors import ConfigError, PlaitaError
from plaita.tasks import tenant_ns

#: Exit code of ``cancel`` when the execution had ended ``completed`` or ``error`` first.
CANCEL_TOO_LATE = 3
#: Statuses ``list`` understands (the index has one sorted set each).
LIST_STATUSES = ("queued", "running", "suspended", "completed", "error", "cancelled")


def add_parsers(group: GroupMaker) -> None:
    """The ``executions`` command group (``group``: ``command_group`` on the main parser)."""
    executions = group(
        "executions",
        help="start, steer and inspect flow executions",
        description=(
            "start FLOW | resume ID | send ID TOPIC | cancel ID | retry ID | fork ID | list | show ID | steps ID | "
            "delete ID... | prune | cancel-many | resume-many (the Redis flags may follow the action too)"
        ),
    )
    tenant_help = "the tenant whose executions these are (default: the default tenant)"
    executions.parser.add_argument("--tenant", default=None, help=tenant_help)
    executions.late.add_argument("--tenant", default=argparse.SUPPRESS, help=tenant_help)
    sub = executions.actions
    _add_start(sub)
    _add_steering(sub)
    _add_reading(sub)
    retention.add_parsers(sub)


def _add_start(sub: WithParents) -> None:
    st = sub.add_parser("start", help="start an execution of FLOW")
    st.add_argument("flow", help="flow id")
    st.add_argument("--input", default="{}", help="params as a JSON object (default {})")
    st.add_argument("--execution-id", help="use this execution id (default: a new one)")
    st.add_argument(
        "--dedup-key", help="start at most one execution per key (a held key: its execution's id, a note on stderr)"
    )
    st.add_argument("--wait", action="store_true", help="wait until the execution ends and print its state")
    st.add_argument("--timeout-s", type=seconds, default=60.0, help="longest --wait (default %(default)s)")
    st.add_argument(
        "--deadline-s", type=float, help="cancel the whole execution (its children too) if not ended by then"
    )
    st.add_argument(
        "--delay-s", type=float, help="a delayed start: recorded queued now, its task added when due (<= 10 years)"
    )
    add_priority_option(st)
    st.add_argument("--json", action="store_true", help="print JSON")


def _add_steering(sub: WithParents) -> None:
    rs = sub.add_parser("resume", help="resume a suspended execution")
    rs.add_argument("id", help="execution id")
    rs.add_argument("--type", default="event", choices=["event", "continue", "retry", "timeout", "cancel"])
    rs.add_argument("--data", help="resume data as JSON")
    rs.add_argument("--resume-id", help="idempotency key: a second resume with it is a no-op")
    rs.add_argument(
        "--wait-for",
        metavar="NAME",
        help="address the event to the step waiting with ctx.suspend(wait_for=NAME); sent early, it is kept "
        "until that wait runs",
    )
    sd = sub.add_parser("send", help="send a message to TOPIC of an execution (a step takes it with ctx.recv)")
    sd.add_argument("id", help="execution id")
    sd.add_argument("topic", help="the topic (ctx.recv(TOPIC)); sent before its recv, it is kept, oldest first")
    sd.add_argument("--data", help="the message as JSON")
    sd.add_argument("--idempotency-key", metavar="K", help="a second send with K is a no-op")
    rt = sub.add_parser("retry", help="restart an error or cancelled execution at its step (or --from-step)")
    rt.add_argument("id", help="execution id")
    rt.add_argument("--from-step", help="restart at this step (one it ran); the results of it and later steps go")
    rt.add_argument("--force", action="store_true", help="re-run a completed execution (without: a no-op, said so)")
    fk = sub.add_parser(
        "fork", help="start a new execution at a step of ID, the results before it copied (ID is left as it is)"
    )
    fk.add_argument("id", help="the execution to fork")
    fk.add_argument("--from-step", required=True, help="the step the new execution starts at (one ID ran)")
    fk.add_argument("--new-id", help="the new execution's id (default: a new one)")
    fk.add_argument("--json", action="store_true", help="print JSON")
    cn = sub.add_parser(
        "cancel",
        help="cancel an execution: queued, waiting for a slot, running or suspended, it ends cancelled",
        description=(
            "Exit 0: cancelled, or the cancel is recorded and the execution will end cancelled; 1: no execution "
            "and no start of it queued (or Redis failed, or --wait timed out); 3: it had already ended completed "
            "or error (with --wait: it ended so before the cancel landed)."
        ),
    )
    cn.add_argument("id", help="execution id")
    cn.add_argument("--wait", action="store_true", help="wait until it has ended and say how")
    cn.add_argument("--timeout-s", type=float, default=60.0, help="longest --wait (default %(default)s)")


def _add_reading(sub: WithParents) -> None:
    ls = sub.add_parser("list", help="executions by status, newest update first")
    ls.add_argument("--status", choices=LIST_STATUSES, action="append", help="only this status (repeatable)")
    ls.add_argument("--flow", help="only this flow")
    ls.add_argument(
        "--limit", "--count", dest="limit", type=_limit, default=50,
        help=f"most rows, newest first, read page by page (default %(default)s; at most {MAX_LIMIT})",
    )  # fmt: skip
    ls.add_argument("--all-tenants", action="store_true", help="every tenant's executions (a TENANT column)")
    ls.add_argument("--parent", metavar="ID", help="only the children of execution ID")
    ls.add_argument("--version", help="only executions of this flow version")
    when = "ISO 8601 (UTC unless it says), epoch seconds, or ago: 7d, 12h"
    ls.add_argument("--created-after", type=moment_s, metavar="TIME", help=f"only those created at or after ({when})")
    ls.add_argument("--created-before", type=moment_s, metavar="TIME", help=f"only those created before ({when})")
    ls.add_argument("--cursor", help="go on after the rows an earlier list printed (it names its cursor on stderr)")
    ls.add_argument("--json", action="store_true", help="print JSON")
    sh = sub.add_parser("show", help="one execution: state and step timeline")
    sh.add_argument("id", help="execution id")
    sh.add_argument("--json", action="store_true", help="print JSON")
    listing.add_steps_parser(sub)


def _client(args: argparse.Namespace) -> Any:
    return flow_client_of(args, tenant_id=args.tenant)


def run_executions(args: argparse.Namespace) -> int:

    try:
        tenant_ns(args.tenant)
    except ValueError as exc:
        raise ConfigError(f"--tenant: {exc}") from None
    if args.executions_command == "start":
        params = json_arg(args.input, "--input")
        if not isinstance(params, dict):
            raise ConfigError("--input must be a JSON object")
        if args.deadline_s is not None:
            from plaita.flows.model.validate import check_deadline_s

            try:
                check_deadline_s(args.deadline_s)
            except ValueError as exc:
                raise ConfigError(f"--deadline-s: {exc}") from None
    if args.executions_command == "send":
        json_arg(args.data, "--data")  # bad JSON is a bad flag (exit 2), refused before connecting
    retention.check_flags(args)
    if args.executions_command == "list" and args.all_tenants and args.tenant is not None:
        raise ConfigError("--all-tenants lists every tenant: give it without --tenant")
    flows = _client(args)
    try:
        return _COMMANDS[args.executions_command](flows, args)
    except PlaitaError as exc:  # unknown execution, wait timed out
        print(f"plaita executions {args.executions_command}: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:  # input FlowClient refuses before enqueueing (NaN in --input, ...)
        print(f"plaita executions {args.executions_command}: error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        return redis_failed("executions", args.redis_url, exc)
    finally:
        flows.close()


def _start(flows: Any, args: argparse.Namespace) -> int:
    from plaita.flows.producer.client import DuplicateStart

    params = json.loads(args.input)
    try:
        eid = flows.start(
            args.flow,
            params,
            execution_id=args.execution_id,
            dedup_key=args.dedup_key,
            deadline_s=args.deadline_s,
            delay_s=args.delay_s,
            on_duplicate="raise",
            priority=args.priority,
        )
    except DuplicateStart as dup:  # still exit 0 with the holder's id: the start is done, once
        eid = dup.execution_id
        print(f"plaita executions start: {dup}", file=sys.stderr)
    if not args.wait:
        print(json.dumps({"execution_id": eid}) if args.json else eid)
        return 0
    doc = flows.wait(eid, args.timeout_s)
    _print_doc(doc, as_json=args.json)
    return 0 if doc.get("status") == "completed" else 1


def _resume(flows: Any, args: argparse.Namespace) -> int:
    data = json_arg(args.data, "--data")
    task_id = flows.resume(args.id, args.type, data, resume_id=args.resume_id, wait_for=args.wait_for)
    print(task_id)
    return 0


def _send(flows: Any, args: argparse.Namespace) -> int:
    data = json_arg(args.data, "--data")
    print(flows.send(args.id, args.topic, data, idempotency_key=args.idempotency_key))
    return 0


def _retry(flows: Any, args: argparse.Namespace) -> int:
    rid = flows.retry(args.id, args.from_step, force=args.force)
    if not rid:  # completed and no --force: nothing to do, and that is no failure
        print(f"execution {args.id} completed: nothing to retry, nothing enqueued (--force re-runs it)")
        return 0
    print(f"retry {rid} of execution {args.id} enqueued" + (f" (from step {args.from_step})" if args.from_step else ""))
    return 0


def _fork(flows: Any, args: argparse.Namespace) -> int:
    new_id = flows.fork(args.id, args.from_step, args.new_id)
    if args.json:
        print(json.dumps({"execution_id": new_id, "forked_from": args.id, "from_step": args.from_step}))
    else:
        print(f"execution {new_id} forked from {args.id} at step {args.from_step} and started")
    return 0


def _cancel(flows: Any, args: argparse.Namespace) -> int:
    """Exit 0: cancelled, or the cancel is recorded and it will end cancelled; 3: it had ended
    (completed or error) before; with ``--wait`` the status it ended with decides."""
    done = flows.cancel(args.id)
    print(done.describe())
    if not args.wait or not done.landed:
        return 0 if done.landed else CANCEL_TOO_LATE
    status = flows.wait(args.id, args.timeout_s).get("status")
    if status == "cancelled":
        print(f"execution {args.id} cancelled")
        return 0
    print(f"execution {args.id} ended {status} before the cancel landed")
    return CANCEL_TOO_LATE


def _list(flows: Any, args: argparse.Namespace) -> int:
    """Reads only (never prunes the index); an unreadable execution key is one line on stderr
    and the others are listed. When more rows follow, the cursor to go on with is on stderr."""
    listed = list_rows(flows, args)
    _report_unreadable(listed.bad)
    if listed.capped:
        print(f"plaita executions list: stopped after {MAX_SCANNED} index entries", file=sys.stderr)
    if listed.cursor is not None:
        print(f"plaita executions list: more: --cursor {listed.cursor}", file=sys.stderr)
    if args.json:
        print(json_text([summary(r, tenant=args.all_tenants) for r in listed.rows], indent=2, ensure_ascii=False))
        return 0
    tenant_head = f"{'TENANT':16} " if args.all_tenants else ""
    print(f"{tenant_head}{'EXECUTION':34} {'FLOW':16} {'STATUS':10} {'STEP':18} UPDATED")
    for r in listed.rows:
        tenant = f"{r.tenant or 'default':16} " if args.all_tenants else ""
        print(
            f"{tenant}{r.execution_id:34} {r.flow_id or '?':16} {r.status:10} {r.step or '':18} {_when(r.updated_at)}"
        )
    if not listed.rows:
        print("(no executions)")
    return 0


def _limit(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not 1 <= value <= MAX_LIMIT:
        raise argparse.ArgumentTypeError(f"must be from 1 to {MAX_LIMIT}, not {value}")
    return value


#: Unreadable keys named one line each; past this, one line counts the rest.
MAX_BAD_LINES = 20


def _report_unreadable(bad: Sequence[Any]) -> None:
    for exc in bad[:MAX_BAD_LINES]:
        print(f"plaita executions list: skipped: {exc}", file=sys.stderr)
    if len(bad) > MAX_BAD_LINES:
        print(f"plaita executions list: skipped {len(bad) - MAX_BAD_LINES} more unreadable key(s)", file=sys.stderr)


def _show(flows: Any, args: argparse.Namespace) -> int:
    doc = flows.get(args.id)
    if doc is None:
        print(f"plaita executions show: no execution {args.id!r}", file=sys.stderr)
        return 1
    events = flows.store.events(args.id)
    if args.json:
        print(json_text({**doc, "events": events}, indent=2, ensure_ascii=False))
        return 0
    _print_doc(doc, as_json=False)
    _print_events(events)
    return 0


def _print_events(events: dict[str, Any]) -> None:
    """What the steps published (``ctx.publish``), newest value of each name."""
    if not events:
        return
    print("events:")
    for name, record in events.items():
        value = json.dumps(record.get("value"), ensure_ascii=False)[:200]
        print(f"  {name!s:18} {value}  (step {record.get('step')}, {_when(record.get('at'))})")


def _when(ts: Any) -> str:
    if not isinstance(ts, int | float) or isinstance(ts, bool):
        return "-"
    try:
        return datetime.datetime.fromtimestamp(ts, tz=datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")
    except (OverflowError, OSError, ValueError):  # out of the calendar's range, or NaN
        return repr(ts)


def _print_doc(doc: dict[str, Any], *, as_json: bool) -> None:
    if as_json:
        print(json_text(doc, indent=2, ensure_ascii=False))
        return
    print(
        f"execution {doc.get('execution_id')}  flow {doc.get('flow_id')}  status {doc.get('status')}  "
        f"step {doc.get('step')}"
    )
    print(
        f"created {_when(doc.get('created_at'))}  updated {_when(doc.get('updated_at'))}  "
        f"ended {_when(doc.get('ended_at'))}"
    )
    suspension = doc.get("suspension")
    if isinstance(suspension, dict) and doc.get("status") == "suspended":  # an ended one waits no more
        what = "sleeping after" if suspension.get("kind") == "sleep" else "suspended in"
        waits = f" waiting for {suspension['wait_for']}" if suspension.get("wait_for") else ""
        print(
            f"{what} {suspension.get('step')}{waits} since {_when(suspension.get('since'))}, "
            f"{'until' if suspension.get('kind') == 'sleep' else 'deadline'} {_when(suspension.get('deadline'))}"
        )
    for kept in doc.get("inbox") or []:
        if isinstance(kept, dict):
            print(f"resume {kept.get('id')} for wait {kept.get('wait_for')} kept since {_when(kept.get('at'))}")
    waiting = doc.get("waiting")
    if isinstance(waiting, dict) and doc.get("status") == "queued" and waiting.get("for") == "due":
        print(f"delayed start: due {_when(waiting.get('until'))} (task {waiting.get('task')})")
    elif isinstance(waiting, dict) and doc.get("status") == "queued":
        print(
            f"waiting for a worker of version {waiting.get('version')} since {_when(waiting.get('since'))}, "
            f"until {_when(waiting.get('until'))} (then dead-lettered)"
        )
    if doc.get("deadline_at") is not None:
        print(f"deadline {_when(doc.get('deadline_at'))}")
    error = doc.get("error")
    if isinstance(error, dict):
        # A cancel with a reason (its deadline passed) is no failure: say which it is.
        what = "cancelled" if doc.get("status") == "cancelled" else "error"
        print(f"{what} in {error.get('step')}: {error.get('type')}: {error.get('message')}")
    print(f"state {json.dumps(doc.get('state'), ensure_ascii=False)[:500]}")
    _print_timeline(doc.get("history"))


def _print_timeline(history: Any) -> None:
    """One line per history entry, oldest first."""
    print("timeline:")
    # Any JSON object is shown: a field of an unexpected type prints as it is, never a traceback.
    for e in history if isinstance(history, list) else []:
        if not isinstance(e, dict):
            print(f"  {json.dumps(e, ensure_ascii=False)[:200]}")
            continue
        took_ms = (number_or_zero(e.get("ended_at")) - number_or_zero(e.get("started_at"))) * 1000
        extra = f"  {e['error']}" if e.get("error") else ""
        if e.get("outcome") == "restarted":
            extra = f"  from {e.get('from_status')} by {e.get('by')}"
        elif e.get("outcome") == "resumed":
            extra = f"  by {e.get('resume_id')} ({e.get('wait_for') or e.get('resume_type')})"
        print(
            f"  {_when(e.get('started_at'))}  {e.get('step')!s:18} attempt {e.get('attempt')}  "
            f"{e.get('outcome')!s:9} {took_ms:8.1f} ms{extra}"
        )


_COMMANDS: dict[str, Callable[[Any, argparse.Namespace], int]] = {
    "start": _start,
    "resume": _resume,
    "send": _send,
    "cancel": _cancel,
    "retry": _retry,
    "fork": _fork,
    "list": _list,
    "show": _show,
    "steps": listing.run_steps,
    **retention.COMMANDS,
}
