"""``plaita doctor``: the server settings under which plaita loses or refuses work, found before they bite.

The checks themselves are pure (``plaita.ops.server_checks``); this module reads the servers (every
master of a cluster) and the fleet's registry, and turns findings into an exit code: 0 for ok and
info, 1 for a warning, 3 for an error (2 stays "bad flags", as for every command). A Redis failure
is one ``connect`` finding, never a raise.

A worker runs the server checks once, after its first successful read, from INFO alone (its ACL user
has no CONFIG), and logs every warning and error finding as one WARNING line; it never refuses to
start over one.
"""

from __future__ import annotations

from typing import Any

from plaita.config import redact_url
from plaita.ops.fleetcheck import check as fleet_check
from plaita.ops.fleetcheck import fleet_partitions, same_queue
from plaita.ops.server_checks import Finding, Severity, check_cluster, node_findings
from plaita.store.client import NotAClusterError
from plaita.store.errors import describe_failure, is_redis_failure
from plaita.store.fleet_access import FleetAccess
from plaita.store.keyspace import Keyspace
from plaita.store.server_facts import ServerFacts

#: Exit code of ``plaita doctor`` by its worst finding (2 is taken by bad flags).
EXIT_CODES = {Severity.OK: 0, Severity.INFO: 0, Severity.WARN: 1, Severity.ERROR: 3}


#: How the closing line names each severity (one, several).
SUMMARY_NAMES = {
    Severity.ERROR: ("error", "errors"),
    Severity.WARN: ("warning", "warnings"),
    Severity.INFO: ("info", "info"),
}


def exit_code(findings: list[Finding]) -> int:
    return EXIT_CODES[max((f.severity for f in findings), default=Severity.OK)]


def server_findings(servers: list[ServerFacts], *, url: str, partitions: int) -> list[Finding]:
    out = check_cluster(servers, url=url, partitions=partitions)
    for f in servers:
        out += node_findings(f)
    return out


def read_findings(fleet: FleetAccess, *, url: str, partitions: int, ask_config: bool = True) -> list[Finding]:
    """The server checks of what ``fleet`` talks to (``ask_config``: CONFIG GET too); a Redis failure
    is one finding, not a raise."""
    try:
        servers = fleet.servers(ask_config=ask_config)
    except NotAClusterError as exc:
        return [Finding(Severity.ERROR, "cluster", str(exc))]
    except Exception as exc:
        if not is_redis_failure(exc):
            raise
        return [Finding(Severity.ERROR, "connect", f"{redact_url(url)}: {describe_failure(exc)}")]
    return server_findings(servers, url=url, partitions=partitions)


def fleet_findings(fleet: FleetAccess, ks: Keyspace, group: str) -> list[Finding]:
    """The fleet's misconfigurations (``plaita.ops.fleetcheck``) as error findings."""
    try:
        problems = fleet_check(fleet, ks, group)
    except Exception as exc:
        if not is_redis_failure(exc):
            raise
        return [Finding(Severity.INFO, "fleet", f"fleet check skipped: {describe_failure(exc)}")]
    if not problems:
        return [Finding(Severity.OK, "fleet", f"queue {ks.queue}: no partition mismatch, no mixed fleet")]
    return [Finding(Severity.ERROR, "fleet", p) for p in problems]


def _fleet_partitions(fleet: FleetAccess, queue: str, group: str) -> int:
    """The count the queue's registered workers use (the largest on a mismatch), else 1."""
    try:
        counts = fleet_partitions(same_queue(fleet.workers(), queue, group))
    except Exception as exc:
        if not is_redis_failure(exc):
            raise
        return 1  # the fleet check reports the failure
    return max(counts, default=1)


def diagnose(fleet: FleetAccess, *, url: str, queue: str, group: str, partitions: int | None) -> list[Finding]:
    """Everything ``plaita doctor`` reports: the servers, then the fleet (when the servers answered).
    ``partitions`` None: the count the registered workers use, as ``plaita status`` does."""
    if partitions is None:
        partitions = _fleet_partitions(fleet, queue, group)
    findings = read_findings(fleet, url=url, partitions=partitions)
    if any(f.check in ("connect", "cluster") and f.severity is Severity.ERROR for f in findings):
        return findings  # the keys cannot be read either (or not the way the URL says)
    ks = Keyspace(queue, partitions, partitions > 1 or fleet.on_cluster())
    return findings + fleet_findings(fleet, ks, group)


def startup_warnings(fleet: FleetAccess, *, url: str, partitions: int) -> list[Finding]:
    """The server checks a worker logs once: warnings and errors only (its fleet check is separate).
    INFO only: a worker's ACL user has no CONFIG, and a denied call would be an ACL LOG entry."""
    found = read_findings(fleet, url=url, partitions=partitions, ask_config=False)
    return [f for f in found if f.severity >= Severity.WARN]


def describe(findings: list[Finding]) -> str:
    """The closing line: how many of each severity and the exit code."""
    counts = {s: sum(f.severity is s for f in findings) for s in Severity}
    parts = [f"{counts[s]} {SUMMARY_NAMES[s][counts[s] != 1]}" for s in SUMMARY_NAMES if counts[s]]
    return f"{', '.join(parts) or 'all ok'} (exit {exit_code(findings)})"


def as_json(findings: list[Finding], *, url: str) -> dict[str, Any]:
    worst = max((f.severity for f in findings), default=Severity.OK)
    return {
        "redis_url": redact_url(url),
        "worst": worst.label,
        "exit_code": exit_code(findings),
        "findings": [f.as_json() for f in findings],
    }


__all__ = ["EXIT_CODES", "Finding", "Severity", "diagnose", "exit_code", "startup_warnings"]
