"""Settings: every knob of the worker, under the names deployments already set (a promise: they
do not change). The delivery defaults (lease TTL, claim idle time, reclaim interval) are the
original's divided down so that a worker killed and replaced under another consumer name has
its work running elsewhere within ~15 s; set the flags to keep the old, slower ones.

Environment variables are read here and in ``cli.py`` only, never at import time.
"""

from __future__ import annotations

import math
import os
import socket
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from urllib.parse import urlsplit

from plaita.errors import ConfigError
from plaita.redis_urls import CLUSTER_SCHEMES as CLUSTER_SCHEMES
from plaita.redis_urls import SENTINEL_SCHEME as SENTINEL_SCHEME
from plaita.redis_urls import ClusterTarget as ClusterTarget
from plaita.redis_urls import SentinelTarget as SentinelTarget
from plaita.redis_urls import is_cluster_url as is_cluster_url
from plaita.redis_urls import parse_cluster_url as parse_cluster_url
from plaita.redis_urls import parse_sentinel_url as parse_sentinel_url
from plaita.redis_urls import redact_text as redact_text
from plaita.redis_urls import redact_url as redact_url
from plaita.redis_urls import validate_redis_url as validate_redis_url

#: Default Redis URL when neither a flag nor PLAITA_REDIS_URL / REDIS_URL is given.
DEFAULT_REDIS_URL = "redis://localhost:6379/0"
#: Stream key (deployments often use ``plaita:flow:queue:v2``).
DEFAULT_QUEUE_NAME = "plaita:flow:queue"
#: Consumer group shared by every worker of a stream.
DEFAULT_CONSUMER_GROUP = "plaita-workers"
#: XREADGROUP BLOCK: bounded so a stop is noticed within half a second.
DEFAULT_READ_BLOCK_MS = 500
#: Entries idle longer than this may be claimed by RECLAIMING (and only when their lease is
#: gone too). A live worker resets its entries' idle time every renewal interval (a third of the
#: smaller of this and the lease TTL), so this bounds how late a dead worker's work is found,
#: never whether live work is taken. The original's 60 s made that minutes.
DEFAULT_CLAIM_MIN_IDLE_MS = 10_000
#: A task delivered this many times without success goes to the DLQ.
DEFAULT_MAX_DELIVERIES = 5
#: A task whose worker process died this many times while it ran (at least once alone, see
#: ``plaita.runtime.suspects``) goes to the DLQ, and its execution ends ``error``.
DEFAULT_MAX_CRASHES = 3
#: How long a flow start asking for a version no live worker runs waits for one (handed back with
#: a growing delay) before it goes to the DLQ: a deploy that starts that worker later loses nothing.
DEFAULT_VERSION_WAIT_S = 3600.0
#: Exact XTRIM MAXLEN of the DLQ after every add.
DEFAULT_DLQ_MAX_LEN = 1000
#: Drain time for in-flight tasks after SIGTERM before exiting with them left pending.
DEFAULT_DRAIN_TIMEOUT_S = 30.0
#: Payloads larger than this go to the DLQ unparsed.
DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024
#: RECLAIMING is re-entered this often while reading (one Lua call when nothing is idle enough).
DEFAULT_RECLAIM_INTERVAL_S = 2.0
#: Execution lease TTL; renewed every ttl/3 while a task runs. A dead holder's work is reclaimed
#: within about max(TTL, claim idle) + reclaim interval = 12 s; a Redis outage longer than the TTL
#: cancels the tasks running meanwhile (their leases may be gone): raise it for long failovers.
DEFAULT_LEASE_TTL_S = 10.0
#: Lease of the keeper inside a worker (``--keeper``), renewed every third of it.
DEFAULT_KEEPER_LEASE_TTL_S = 10.0
#: Highest task ``schema_version`` this build understands.
TASK_SCHEMA_VERSION = 1
#: Most tasks read ahead of free handler threads when handlers are fast (see ``prefetch``).
DEFAULT_MAX_PREFETCH = 256
#: Most entries asked for in one XREADGROUP: with a prefetch of two reads, the next read
#: overlaps the handling of the previous one.
READ_BATCH_MAX = 128
#: Largest millisecond value Redis takes for an idle time without overflow surprises (~24.8 days).
MAX_MS = 2**31 - 1
#: Longest any TTL, interval or timeout may be: longer ones are typos, never a plan.
MAX_DURATION_S = 7 * 24 * 3600.0
#: Largest entry count for DLQ and payload limits (a sane bound, far above any real use).
MAX_COUNT = 2**31 - 1
#: Most partitions a queue may have (a worker makes one read per partition per pass).
MAX_PARTITIONS = 1024
#: Where steps and handlers run: the worker's threads (and event loop), or child processes.
POOL_KINDS = ("thread", "process")
#: The execution lease formats a worker can write (``--lease-format``; plaita.store.leases); it
#: reads both. v1 is what every earlier plaita writes and reads: the default, so a rolling upgrade
#: mixes old and new workers safely; v2 (one key per execution, cheaper) once every worker runs a
#: version that reads it (docs/reliability.md, "Lease format").
LEASE_FORMATS = ("v1", "v2")


def validate_webhook_url(url: str, flag: str = "--alert-webhook") -> None:
    """Raise ConfigError unless ``url`` is an http(s) URL with a host. The message names the
    scheme and host only: a webhook's path or query is often its token (Slack's are)."""
    try:
        parts = urlsplit(url)
        _ = parts.port  # raises ValueError on a non-numeric port
    except ValueError as exc:
        raise ConfigError(f"invalid {flag}: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        shown = f"{parts.scheme}://{parts.hostname or ''}" if parts.scheme else "a URL without a scheme"
        raise ConfigError(f"invalid {flag} ({shown}): expected http://HOST/... or https://HOST/...")


def default_consumer_name(slot: int = 0) -> str:
    """Stable per host and slot, so a restarted worker resumes its own pending entries."""
    return f"{socket.gethostname()}:{slot}"


def new_instance_id() -> str:
    """``{hostname}-{uuid8}``: the registry/control identity, unique per process, and still telling
    an operator which host it runs on."""
    return f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"


def host_label() -> str:
    """``hostname/ip`` for the registry entry."""
    name = socket.gethostname()
    try:
        ip = socket.gethostbyname(name)
    except OSError:
        ip = "?"
    return f"{name}/{ip}"


@dataclass(frozen=True)
class TlsFiles:
    """CA bundle and client certificate for ``rediss://`` (None = the system default / none)."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None


def check_readable(flag: str, path: str | None) -> None:
    """ConfigError unless ``path`` can be read. The path itself is never printed: key and
    certificate locations are as private as the password they stand in for."""
    if path is None:
        return
    try:
        with open(path, "rb") as f:
            f.read(1)
    except OSError as exc:
        raise ConfigError(f"{flag}: cannot read the file ({exc.strerror or type(exc).__name__})") from None


@dataclass(frozen=True)
class Settings:
    """Everything a worker needs to know; built by the CLI, passed explicitly."""

    redis_url: str = DEFAULT_REDIS_URL
    queue_name: str = DEFAULT_QUEUE_NAME
    consumer_group: str = DEFAULT_CONSUMER_GROUP
    consumer_name: str = field(default_factory=default_consumer_name)
    read_block_ms: int = DEFAULT_READ_BLOCK_MS
    claim_min_idle_ms: int = DEFAULT_CLAIM_MIN_IDLE_MS
    max_deliveries: int = DEFAULT_MAX_DELIVERIES
    max_crashes: int = DEFAULT_MAX_CRASHES
    version_wait_s: float = DEFAULT_VERSION_WAIT_S
    dlq_key: str = ""
    dlq_max_len: int = DEFAULT_DLQ_MAX_LEN
    concurrency: int = 1
    #: Extra tasks read beyond free handler threads. None = automatic: 0 until handlers are
    #: seen to be fast (< 5 ms), then up to DEFAULT_MAX_PREFETCH. Long tasks never hoard.
    prefetch: int | None = None
    drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    reclaim_interval_s: float = DEFAULT_RECLAIM_INTERVAL_S
    lease_ttl_s: float = DEFAULT_LEASE_TTL_S
    #: The execution lease format written (``LEASE_FORMATS``).
    lease_format: str = "v1"
    backoff_base_s: float = 0.1
    backoff_cap_s: float = 1.0
    persistent_backoff_s: float = 5.0
    status_file: str | None = None
    #: Consumers with nothing pending and idle this long are removed from the group.
    consumer_prune_idle_s: float = 3600.0
    #: How often RECLAIMING also prunes idle consumers and sweeps acked residue.
    housekeeping_interval_s: float = 300.0
    #: Registry / control identity; default ``{hostname}-{uuid8}``, new per process.
    instance_id: str | None = None
    #: Registry heartbeat and the control listener (``--no-registry`` turns both off).
    registry_enabled: bool = True
    registry_ttl_s: float = 30.0
    heartbeat_interval_s: float = 10.0
    #: /metrics, /healthz, /readyz port; None = off (the CLI's 0), 0 here = any free port.
    metrics_port: int | None = None
    #: Loopback by default: /metrics says what runs and how; opening it is the operator's choice.
    metrics_host: str = "127.0.0.1"
    #: Lease every task before it starts, even one without an ``execution_id`` (flow workers:
    #: the runner's checkpoints are fenced by the lease generation from the first step).
    eager_leases: bool = False
    #: ``rediss://`` CA bundle and client certificate/key (see ``TlsFiles``).
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    #: Streams the queue is split into (``<queue>:{p<i>}``); 1 = the plain ``<queue>`` key.
    partitions: int = 1
    #: The partitions this worker reads and reclaims; None = all of them.
    partitions_assigned: tuple[int, ...] | None = None
    #: POST JSON alert events to this http(s) URL (``plaita.ops.alerts``); None = off.
    alert_webhook: str | None = None
    #: HMAC-SHA256 key of the ``X-Plaita-Signature`` header (the CLI reads it from the environment
    #: only: a flag would show in ``ps``). Kept out of the repr.
    alert_webhook_secret: str | None = field(default=None, repr=False)
    #: An outage (BACKOFF and its retries) lasting longer than this sends one ``backoff_stuck``.
    alert_backoff_s: float = 30.0
    #: Lease of a keeper run inside the worker (``--keeper``): after a kill -9 of the worker
    #: holding it, another worker's keeper acts within about this long (sleeps, timeouts and
    #: ticks wait meanwhile). Shorter than the standalone keeper's 30 s for that reason.
    keeper_lease_ttl_s: float = DEFAULT_KEEPER_LEASE_TTL_S
    #: ``thread``: steps and handlers run on the worker's threads and loop; ``process``: in a
    #: prefork pool of ``concurrency`` child processes (``plaita.runtime.procpool``), so one that
    #: kills its process fails only its own attempt.
    pool: str = "thread"
    #: ``--pool process``: a child is replaced after this many tasks (None: never).
    max_tasks_per_child: int | None = None
    #: ``--pool process``: a child whose resident memory passed this after a task is replaced.
    max_memory_per_child_mb: int | None = None
    #: Time limit of every step (and, in ``--pool process``, every handler call) without one of its
    #: own: hard in a process pool (the child is killed), soft in threads. None: no limit.
    step_time_limit_s: float | None = None

    def __post_init__(self) -> None:
        validate_redis_url(self.redis_url)
        if self.alert_webhook is not None:
            validate_webhook_url(self.alert_webhook)
        _check_finite(self)
        for flag, path in (
            ("--tls-ca-file", self.tls_ca_file),
            ("--tls-cert-file", self.tls_cert_file),
            ("--tls-key-file", self.tls_key_file),
        ):
            check_readable(flag, path)
        for ok, message in self._checks():
            if not ok:
                raise ConfigError(message)

    def _checks(self) -> list[tuple[bool, str]]:
        """(holds, one-line message) per rule; floats are known finite here."""
        week = MAX_DURATION_S
        return [
            (bool(self.queue_name), "--queue-name must not be empty"),
            (bool(self.consumer_group), "--consumer-group must not be empty"),
            (bool(self.consumer_name), "--consumer-name must not be empty"),
            (100 <= self.read_block_ms <= 10_000, "--read-block-ms must be within 100..10000"),
            (0 <= self.claim_min_idle_ms <= MAX_MS, f"--claim-min-idle-ms must be within 0..{MAX_MS}"),
            (1 <= self.max_deliveries <= MAX_COUNT, f"--max-deliveries must be within 1..{MAX_COUNT}"),
            (1 <= self.max_crashes <= MAX_COUNT, f"--max-crashes must be within 1..{MAX_COUNT}"),
            (0 <= self.version_wait_s <= week, f"--version-wait-s must be within 0..{week:.0f}"),
            (1 <= self.dlq_max_len <= MAX_COUNT, f"--dlq-max-len must be within 1..{MAX_COUNT}"),
            (1 <= self.concurrency <= 1024, "--concurrency must be within 1..1024"),
            (self.prefetch is None or 0 <= self.prefetch <= 100_000, "--prefetch must be within 0..100000"),
            (0 <= self.drain_timeout_s <= week, f"--drain-timeout-s must be within 0..{week:.0f}"),
            (1 <= self.max_payload_bytes <= 512 * 1024 * 1024, "--max-payload-bytes must be within 1..536870912"),
            (0 < self.reclaim_interval_s <= week, f"--reclaim-interval-s must be within 0 (excluded)..{week:.0f}"),
            (1 <= self.lease_ttl_s <= week, f"--lease-ttl-seconds must be within 1..{week:.0f}"),
            (
                self.lease_format in LEASE_FORMATS,
                f"--lease-format must be one of {', '.join(LEASE_FORMATS)} (got {self.lease_format!r})",
            ),
            (0 < self.backoff_base_s <= self.backoff_cap_s <= week, "backoff needs 0 < base <= cap <= a week"),
            (0 < self.persistent_backoff_s <= week, "persistent backoff must be within 0 (excluded)..a week"),
            (
                0 <= self.consumer_prune_idle_s <= MAX_MS / 1000,
                f"--consumer-prune-idle-s must be within 0..{MAX_MS // 1000}",
            ),
            (0 < self.housekeeping_interval_s <= week, "housekeeping interval must be within 0 (excluded)..a week"),
            (0 < self.registry_ttl_s <= week, f"--registry-ttl must be within 0 (excluded)..{week:.0f}"),
            (0 < self.heartbeat_interval_s < self.registry_ttl_s, "--heartbeat-interval must be below --registry-ttl"),
            (self.metrics_port is None or 0 <= self.metrics_port <= 65535, "--metrics-port must be within 0..65535"),
            (bool(self.metrics_host), "--metrics-host must not be empty"),
            *self._partition_checks(),
            (1 <= self.alert_backoff_s <= week, f"--alert-backoff-s must be within 1..{week:.0f}"),
            (1 <= self.keeper_lease_ttl_s <= week, f"--keeper-lease-ttl-s must be within 1..{week:.0f}"),
            *self._pool_checks(),
        ]

    def _pool_checks(self) -> list[tuple[bool, str]]:
        """The rules of ``--pool`` and its flags (``_checks``)."""
        tasks, memory_mb, limit_s = self.max_tasks_per_child, self.max_memory_per_child_mb, self.step_time_limit_s
        in_children = self.pool == "process" or (tasks is None and memory_mb is None)
        return [
            (self.pool in POOL_KINDS, f"--pool must be one of {', '.join(POOL_KINDS)} (got {self.pool!r})"),
            (tasks is None or 1 <= tasks <= MAX_COUNT, f"--max-tasks-per-child must be within 1..{MAX_COUNT}"),
            (memory_mb is None or 1 <= memory_mb <= 2**40, "--max-memory-per-child-mb must be within 1..2^40"),
            (in_children, "--max-tasks-per-child and --max-memory-per-child-mb need --pool process"),
            (
                limit_s is None or (math.isfinite(limit_s) and 0 < limit_s <= MAX_DURATION_S),
                f"--step-time-limit-s must be within 0 (excluded)..{MAX_DURATION_S:.0f}",
            ),
        ]

    def _partition_checks(self) -> list[tuple[bool, str]]:
        """The rules of hash tags and partitions (``_checks``)."""
        return [
            (
                not self.tagged_keys or "{" not in self.queue_name + self.dlq_key,
                "--queue-name and --dlq-key must not contain '{' with partitions or a cluster: plaita adds hash tags",
            ),
            (1 <= self.partitions <= MAX_PARTITIONS, f"--partitions must be within 1..{MAX_PARTITIONS}"),
            (
                self.partitions_assigned is None
                or (bool(self.partitions_assigned) and all(0 <= p < self.partitions for p in self.partitions_assigned)),
                f"--partitions-assigned must list partitions within 0..{self.partitions - 1}",
            ),
        ]

    @property
    def tls(self) -> TlsFiles:
        return TlsFiles(self.tls_ca_file, self.tls_cert_file, self.tls_key_file)

    @property
    def tagged_keys(self) -> bool:
        """Hash-tagged keys (``plaita.store.keyspace``): on Redis Cluster or with partitions > 1."""
        return self.partitions > 1 or is_cluster_url(self.redis_url)

    @property
    def dlq(self) -> str:
        """The DLQ stream key: ``--dlq-key`` or ``<queue>:dlq``."""
        return self.dlq_key or f"{self.queue_name}:dlq"

    @property
    def socket_timeout_s(self) -> float:
        """Socket read timeout: always longer than BLOCK, so an expired BLOCK is not an error."""
        return self.read_block_ms / 1000 + 1.5

    def with_(self, **changes: object) -> Settings:
        """A copy with ``changes`` applied (validated again)."""
        return replace(self, **changes)  # type: ignore[arg-type]

    def describe(self) -> str:
        """One log line with the effective configuration, password redacted."""
        return (
            f"redis={redact_url(self.redis_url)} stream={self.queue_name} group={self.consumer_group} "
            f"consumer={self.consumer_name} concurrency={self.concurrency} block_ms={self.read_block_ms} "
            f"claim_min_idle_ms={self.claim_min_idle_ms} max_deliveries={self.max_deliveries} dlq={self.dlq}"
            + (f" partitions={self.partitions}" if self.partitions > 1 or is_cluster_url(self.redis_url) else "")
            + (f" assigned={','.join(map(str, self.partitions_assigned))}" if self.partitions_assigned else "")
            + (f" pool={self.pool}" if self.pool != "thread" else "")
            + (f" lease_format={self.lease_format}" if self.lease_format != "v1" else "")
        )


#: Settings float fields and their flag names, for the finiteness check.
_FLOAT_FLAGS = {
    "drain_timeout_s": "--drain-timeout-s",
    "reclaim_interval_s": "--reclaim-interval-s",
    "lease_ttl_s": "--lease-ttl-seconds",
    "backoff_base_s": "backoff base",
    "backoff_cap_s": "backoff cap",
    "persistent_backoff_s": "persistent backoff",
    "consumer_prune_idle_s": "--consumer-prune-idle-s",
    "housekeeping_interval_s": "housekeeping interval",
    "registry_ttl_s": "--registry-ttl",
    "heartbeat_interval_s": "--heartbeat-interval",
    "alert_backoff_s": "--alert-backoff-s",
    "keeper_lease_ttl_s": "--keeper-lease-ttl-s",
}


def _check_finite(settings: Settings) -> None:
    """ConfigError for a nan or infinite float: every comparison with nan is False, so a nan
    would pass a range check written as ``not (x < low)`` and silently stop the worker."""
    for name, flag in _FLOAT_FLAGS.items():
        value = getattr(settings, name)
        if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
            raise ConfigError(f"{flag} must be a finite number (got {value!r})")


def env_first(env: Mapping[str, str], *names: str) -> str | None:
    """The first non-empty environment variable among ``names``."""
    for name in names:
        value = env.get(name)
        if value:
            return value
    return None


def environ() -> Mapping[str, str]:
    """The process environment (a seam for tests)."""
    return os.environ
