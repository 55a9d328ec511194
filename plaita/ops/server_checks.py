"""The server checks of ``plaita doctor``: pure functions of what a server says about itself.

Each takes a ``ServerFacts`` (INFO and a few CONFIG values, ``plaita.store.server_facts``) and
returns findings of four severities: ``ok``, ``info`` (worth knowing, nothing to fix), ``warn``
(data can be lost in a crash, or soon) and ``error`` (plaita loses or refuses work in normal
operation, or cannot run as configured). A value the server would not show is a finding too
("could not read X (ACL: …)"), never a failure.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from plaita.config import is_cluster_url
from plaita.store.server_facts import ServerFacts

#: Memory use (of maxmemory, or of the machine without one) from which a warning is given ...
MEMORY_WARN_RATIO = 0.80
#: ... and from which it is an error: a burst of enqueues or checkpoints reaches the limit.
MEMORY_ERROR_RATIO = 0.95
#: The oldest Redis plaita supports (and is tested on): the ACL rules use 7.0's ``command|subcommand``.
MIN_REDIS = (7, 0)
#: The first Redis with XNACK (a graceful stop hands entries back without re-adding them).
XNACK_REDIS = (8, 8)


class Severity(enum.IntEnum):
    OK = 0
    INFO = 1
    WARN = 2
    ERROR = 3

    @property
    def label(self) -> str:
        return self.name.lower()


@dataclass(frozen=True)
class Finding:
    severity: Severity
    #: What was checked: connect, access, version, role, cluster, eviction, persistence, fsync,
    #: disk, memory, fleet.
    check: str
    message: str
    #: ``host:port`` of a cluster's master; "" for the single server of a plain URL.
    node: str = ""

    def line(self) -> str:
        where = f"{self.node}: " if self.node else ""
        return f"{self.severity.label:<5} {self.check:<11} {where}{self.message}"

    def as_json(self) -> dict[str, str]:
        return {"severity": self.severity.label, "check": self.check, "node": self.node, "message": self.message}


def _human(n_bytes: int) -> str:
    size = float(n_bytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"  # pragma: no cover - the loop always returns


def _setting(f: ServerFacts, param: str) -> str | None:
    """A configuration value: CONFIG GET's, else what INFO shows of it, else None (unreadable)."""
    if param in f.config:
        return f.config[param]
    from_info = {"maxmemory-policy": "maxmemory_policy", "maxmemory": "maxmemory", "appendonly": "aof_enabled"}
    key = from_info.get(param)
    if key is None or key not in f.info:
        return None
    value = f.info[key]
    return ("yes" if int(value) else "no") if param == "appendonly" else str(value)


def _why(f: ServerFacts, param: str) -> str:
    return f.refused.get(param) or f.refused.get("INFO") or "not shown by the server"


def _unreadable(f: ServerFacts, check: str, param: str, consequence: str) -> Finding:
    return Finding(Severity.INFO, check, f"could not read {param} ({_why(f, param)}): {consequence}", f.node)


def check_access(f: ServerFacts) -> list[Finding]:
    if "INFO" not in f.refused:
        return []
    return [
        Finding(
            Severity.WARN,
            "access",
            f"could not read INFO ({f.refused['INFO']}): version, role, memory and persistence went unchecked; "
            "run plaita doctor as a user with +info and +config|get",
            f.node,
        )
    ]


def _version(text: str) -> tuple[int, int]:
    parts = [int(p) for p in text.split(".")[:2] if p.isdigit()]
    return (parts + [0, 0])[0], (parts + [0, 0])[1]


def check_version(f: ServerFacts) -> list[Finding]:
    if "redis_version" not in f.info:
        return []
    valkey = "valkey" in str(f.info.get("server_name", "")).lower()
    text = str(f.info.get("valkey_version") if valkey and "valkey_version" in f.info else f.info["redis_version"])
    name = f"{'Valkey' if valkey else 'Redis'} {text}"
    if valkey:  # every Valkey release is Redis 7.2 compatible; none has XNACK
        return [Finding(Severity.INFO, "version", f"{name}: supported; no XNACK, so {_NO_XNACK}", f.node)]
    version = _version(text)
    if version < MIN_REDIS:
        return [
            Finding(
                Severity.ERROR,
                "version",
                f"{name} is older than plaita supports (Redis >= {MIN_REDIS[0]}.{MIN_REDIS[1]}, or Valkey): scripts, "
                "stream commands or the ACL rules fail on it; upgrade the server",
                f.node,
            )
        ]
    if version < XNACK_REDIS:
        text = f"{name}: supported; no XNACK (Redis >= 8.8), so {_NO_XNACK}"
        return [Finding(Severity.INFO, "version", text, f.node)]
    return [Finding(Severity.OK, "version", f"{name}: every feature plaita uses, XNACK included", f.node)]


_NO_XNACK = "a graceful stop hands unstarted tasks back by re-adding them (new stream ids)"


def check_role(f: ServerFacts) -> list[Finding]:
    if f.info.get("role") != "slave":
        return []
    master = f"{f.info.get('master_host', '?')}:{f.info.get('master_port', '?')}"
    return [
        Finding(
            Severity.ERROR,
            "role",
            f"the server is a read-only replica of {master}: every write fails with READONLY; point --redis-url "
            "at the master (or use redis+sentinel:// to follow it)",
            f.node,
        )
    ]


def check_eviction(f: ServerFacts) -> list[Finding]:
    policy = _setting(f, "maxmemory-policy")
    if policy is None:
        return [_unreadable(f, "eviction", "maxmemory-policy", "anything but noeviction lets Redis drop plaita's keys")]
    if policy == "noeviction":
        return [
            Finding(
                Severity.OK,
                "eviction",
                "maxmemory-policy noeviction: a full server refuses writes (workers back off) instead of dropping keys",
                f.node,
            )
        ]
    victims = (
        "keys with a TTL (execution leases: a second worker then runs the same step; registry entries)"
        if policy.startswith("volatile-")
        else "any key (the stream with its pending tasks, leases, execution states)"
    )
    limit = int(_setting(f, "maxmemory") or 0)
    if limit == 0:
        return [
            Finding(
                Severity.WARN,
                "eviction",
                f"maxmemory-policy {policy} (no maxmemory set yet): once a limit is set, Redis silently evicts "
                f"{victims}; set maxmemory-policy noeviction",
                f.node,
            )
        ]
    return [
        Finding(
            Severity.ERROR,
            "eviction",
            f"maxmemory-policy {policy} with maxmemory {_human(limit)}: under memory pressure Redis silently evicts "
            f"{victims}: tasks and executions vanish without an error; set maxmemory-policy noeviction",
            f.node,
        )
    ]


def _save_window_s(save: str) -> int:
    """The longest interval of a ``save`` rule (``3600 1 300 100`` → 3600): a quiet server's loss window."""
    numbers = [int(p) for p in save.split() if p.isdigit()]
    return max(numbers[0::2], default=0)


def check_persistence(f: ServerFacts) -> list[Finding]:
    aof = _setting(f, "appendonly")
    save = f.config.get("save")
    if aof == "yes":
        rdb = f" and RDB snapshots (save {save})" if save else ""
        return [Finding(Severity.OK, "persistence", f"AOF on{rdb}", f.node), *check_fsync(f)]
    if aof is None:
        return [_unreadable(f, "persistence", "appendonly", "without AOF a crash loses recent enqueues and acks")]
    if save is None:  # AOF off: at best RDB snapshots, at worst nothing at all
        return [
            Finding(
                Severity.WARN,
                "persistence",
                f"appendonly no, and save is unknown ({_why(f, 'save')}): a crash loses every write since "
                "the last RDB snapshot, or the whole queue if snapshots are off too; set appendonly yes",
                f.node,
            )
        ]
    if not save.strip():
        return [
            Finding(
                Severity.ERROR,
                "persistence",
                'no persistence (appendonly no, save ""): a restart of Redis loses the whole queue, every execution '
                "state, lease and schedule; set appendonly yes",
                f.node,
            )
        ]
    return [
        Finding(
            Severity.WARN,
            "persistence",
            f"RDB snapshots only (save {save}): a crash loses every write since the last snapshot, up to "
            f"{_save_window_s(save)} s of enqueues, acks and checkpoints on a quiet server; set appendonly yes",
            f.node,
        )
    ]


def check_fsync(f: ServerFacts) -> list[Finding]:
    """How much an AOF can lose: only a crash of the machine (power, kernel) loses written-but-unsynced
    data; a crash of redis-server alone loses nothing, the kernel still has it."""
    fsync = f.config.get("appendfsync")
    if fsync is None:
        return [_unreadable(f, "fsync", "appendfsync", "with everysec a machine crash loses up to about 1 s of writes")]
    if fsync == "always":
        return [Finding(Severity.OK, "fsync", "appendfsync always: every acknowledged write is on disk", f.node)]
    if fsync == "everysec":
        return [
            Finding(
                Severity.INFO,
                "fsync",
                "appendfsync everysec: a crash of the machine (power, kernel) loses up to about 1 s of acknowledged "
                "enqueues, acks and checkpoints (2 s while the disk stalls); appendfsync always loses none",
                f.node,
            )
        ]
    return [
        Finding(
            Severity.WARN,
            "fsync",
            f"appendfsync {fsync}: the kernel writes the AOF out when it likes (Linux: within about 30 s), so a "
            "crash of the machine loses up to that much of acknowledged enqueues, acks and checkpoints; "
            "set appendfsync everysec (about 1 s) or always (none)",
            f.node,
        )
    ]


def check_disk(f: ServerFacts) -> list[Finding]:
    """A failed snapshot or AOF write makes Redis refuse every write until one succeeds."""
    out = []
    for key, what in (("rdb_last_bgsave_status", "RDB snapshot"), ("aof_last_write_status", "AOF write")):
        if str(f.info.get(key, "ok")) != "ok":
            out.append(
                Finding(
                    Severity.ERROR,
                    "disk",
                    f"the last {what} failed ({key}: {f.info[key]}): Redis refuses writes until one succeeds "
                    "(stop-writes-on-bgsave-error, appendfsync); see its log (disk full?)",
                    f.node,
                )
            )
    return out


def check_memory(f: ServerFacts) -> list[Finding]:
    if "used_memory" not in f.info:
        return []
    # What eviction and OOM count: replication and AOF buffers are left out.
    used = int(f.info["used_memory"]) - int(f.info.get("mem_not_counted_for_evict", 0))
    limit = int(_setting(f, "maxmemory") or 0)
    against = limit or int(f.info.get("total_system_memory", 0))
    if not against:
        return [Finding(Severity.OK, "memory", f"{_human(used)} used, no maxmemory", f.node)]
    ratio = used / against
    if limit:
        text = f"{_human(used)} used of maxmemory {_human(limit)} ({ratio:.0%})"
        full = "Redis refuses writes: enqueues fail, workers back off"
    else:
        text = f"{_human(used)} used, no maxmemory ({ratio:.0%} of the machine's {_human(against)})"
        full = "the kernel's out-of-memory killer ends Redis"
    if ratio >= MEMORY_ERROR_RATIO:
        return [Finding(Severity.ERROR, "memory", f"{text}: at the limit, {full}; add memory or trim data", f.node)]
    if ratio >= MEMORY_WARN_RATIO:
        return [Finding(Severity.WARN, "memory", f"{text}: close to the limit; add memory or trim data", f.node)]
    return [Finding(Severity.OK, "memory", text, f.node)]


#: The checks of one server, in the order they are printed.
NODE_CHECKS: tuple[Callable[[ServerFacts], list[Finding]], ...] = (
    check_access,
    check_version,
    check_role,
    check_eviction,
    check_persistence,
    check_disk,
    check_memory,
)


def check_cluster(servers: list[ServerFacts], *, url: str, partitions: int) -> list[Finding]:
    """Cluster mode on the server against the URL's scheme, and partitions against masters."""
    if not is_cluster_url(url):
        enabled = [f for f in servers if int(f.info.get("cluster_enabled", 0))]
        if not enabled:
            return []
        scheme = url.split("://", 1)[0]
        return [
            Finding(
                Severity.ERROR,
                "cluster",
                f"the server is a Redis Cluster node but --redis-url is {scheme}://: commands on keys of other nodes' "
                "slots fail with MOVED; use redis+cluster://HOST:PORT",
            )
        ]
    masters = len(servers)
    text = f"Redis Cluster of {masters} master(s), queue in {partitions} partition(s)"
    if partitions < masters:
        return [
            Finding(
                Severity.INFO,
                "cluster",
                f"{text}: {masters - partitions} master(s) hold no partition stream and carry no queue traffic; "
                f"--partitions {masters} (or more) on every producer and worker spreads it",
            )
        ]
    return [Finding(Severity.OK, "cluster", text)]


def node_findings(f: ServerFacts) -> list[Finding]:
    """Every check of one server, in ``NODE_CHECKS`` order."""
    return [finding for check in NODE_CHECKS for finding in check(f)]
