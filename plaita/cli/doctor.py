"""``plaita doctor``: one line per finding about the Redis the queue lives on, exit code by severity."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Mapping

from plaita.cli.options import Unset, tls_of
from plaita.config import DEFAULT_CONSUMER_GROUP, DEFAULT_REDIS_URL, Settings, env_first

#: Socket timeout of the doctor's client: an answer in seconds, not a hang on a frozen server.
DOCTOR_SOCKET_TIMEOUT_S = 5.0

EPILOG = """\
checks: eviction (maxmemory-policy must be noeviction), persistence (AOF or RDB), fsync
(appendfsync: how much a crash loses), disk (failed snapshot or AOF write), memory (use against
maxmemory), version (Redis >= 7.0 or Valkey; XNACK from 8.8), role (not a replica), cluster (the
server's cluster mode against the URL; partitions against masters), access (INFO or CONFIG GET
refused by an ACL or a managed service: said as a finding), fleet (partition mismatch, handler and
flow workers sharing a queue).

exit codes: 0 every finding ok or info, 1 a warning, 3 an error (Redis unreachable included),
2 bad flags. CONFIG GET needs +config|get, which a worker's minimal ACL does not grant: run the
doctor as an operator.
"""


def add_parser(
    add: Callable[..., argparse.ArgumentParser],
    redis_options: Callable[[argparse.ArgumentParser], None],
    env: Mapping[str, str],
) -> None:
    d = add(
        "doctor",
        help="check the Redis settings plaita depends on (eviction, persistence, fsync, memory, version, cluster)",
        description="Read INFO and CONFIG of the server (every master of a cluster) and the fleet's registry; "
        "print one line per finding: ok, info, warn or error.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    redis_options(d)
    d.add_argument(
        "--consumer-group",
        default=env_first(env, "PLAITA_CONSUMER_GROUP") or DEFAULT_CONSUMER_GROUP,
        help=f"consumer group (env PLAITA_CONSUMER_GROUP; default {DEFAULT_CONSUMER_GROUP})",
    )
    d.add_argument("--json", action="store_true", help="print one JSON object instead of lines")


def run_doctor(args: argparse.Namespace) -> int:
    from plaita.ops.doctor import as_json, describe, diagnose, exit_code
    from plaita.store.fleet_access import FleetAccess

    url = args.redis_url or DEFAULT_REDIS_URL
    # No --partitions (nor its variable): the count the registered workers use.
    partitions = None if isinstance(args.partitions, Unset) else int(args.partitions)
    # Checks the URL, the queue name and the partition count the way a worker would (ConfigError: exit 2).
    Settings(
        redis_url=url,
        queue_name=args.queue_name,
        consumer_group=args.consumer_group,
        partitions=1 if partitions is None else partitions,
    )
    fleet = FleetAccess.connect(url, socket_timeout_s=DOCTOR_SOCKET_TIMEOUT_S, tls=tls_of(args))
    try:
        findings = diagnose(fleet, url=url, queue=args.queue_name, group=args.consumer_group, partitions=partitions)
    finally:
        fleet.close()
    if args.json:
        print(json.dumps(as_json(findings, url=url), indent=2))
    else:
        for finding in findings:
            print(finding.line())
        print(f"plaita doctor: {describe(findings)}")
    return exit_code(findings)
