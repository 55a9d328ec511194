"""``plaita migrate ids``: move the keys of ids holding ``:`` or ``%`` to their escaped names."""

from __future__ import annotations

import argparse
import json

from plaita.cli.common import redis_failed
from plaita.cli.options import GroupMaker, tls_of
from plaita.config import DEFAULT_REDIS_URL, Settings

EPILOG = """\
Since 2026-12 an id goes into its keys with ':' written '%3A' and '%' written '%25' (so no id can
name another execution's key); plain ids keep their keys. Run this once per queue after stopping
the old workers and before starting the new ones: it moves the state, events, cancel flag, fence,
lease, keeper retry mark and children's done set of every indexed execution whose id holds ':' or
'%' (children and schedule ticks do), every tenant and partition, and start-dedup keys holding ':'.
A key already written under its new name is kept and the old one reported. Running it twice is safe.

exit codes: 0 done (or nothing to do), 1 Redis failed or keys were left (conflicts), 2 bad flags.
"""


def add_parsers(group: GroupMaker) -> None:
    sub = group(
        "migrate",
        help="move keys to the current layout (after an upgrade)",
        description="key migrations",
    ).actions
    ids = sub.add_parser(
        "ids",
        help="move the keys of ids holding ':' or '%%' to their escaped names",
        description="Move the keys of executions whose id holds ':' or '%' to the escaped layout.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ids.add_argument("--dry-run", action="store_true", help="count what would move; change nothing")
    ids.add_argument("--json", action="store_true", help="print one JSON object")


def run_migrate(args: argparse.Namespace) -> int:
    from plaita.store.client import make_client
    from plaita.store.migrate_ids import migrate_ids
    from plaita.store.streams.partitioned import keyspace_of

    url = args.redis_url or DEFAULT_REDIS_URL
    settings = Settings(redis_url=url, queue_name=args.queue_name, partitions=int(args.partitions))
    client = make_client(url, socket_timeout_s=10.0, tls=tls_of(args))
    try:
        report = migrate_ids(client, keyspace_of(settings), dry_run=args.dry_run)
    except Exception as exc:
        return redis_failed("migrate", args.redis_url, exc)
    finally:
        client.close()
    if args.json:
        print(json.dumps({"dry_run": args.dry_run, **report.as_json()}, indent=2))
    else:
        verb = "would move" if args.dry_run else "moved"
        print(f"plaita migrate ids: {verb} {report.moved} keys of {report.executions} executions")
        for old, new in report.conflicts:
            print(f"left {old}: {new} exists already (the new key is kept)")
        for old in report.foreign:
            print(f"left {old}: it holds another execution's document")
    return 1 if report.conflicts else 0
