"""Where every key of a queue lives: one partition is today's keys; more (or a cluster) are hash-tagged.

With one partition on one Redis every key keeps the untagged name existing deployments use (``<queue>``,
``plaita:execution:lease:<id>``, …). With ``partitions > 1`` or on Redis Cluster, partition ``i``
has a hash tag ``T = {p<i>}`` (``{p<i>.<k>}`` where that spreads better, see ``partition_tag``)
and every key that one atomic script touches carries it, so each script stays in one slot:

=====================  ==============================================
stream                 ``<queue>:T``            (DLQ ``<queue>:T:dlq``)
delayed tasks          ``<queue>:T:delayed``    (``plaita.store.streams.delayed.delayed_key``)
priority level L       ``<queue>:T:prio<L>``    (L in 1..9; its delayed set ``<queue>:T:prio<L>:delayed``)
levels in use          ``<queue>:T:prio-levels`` (a set of L; ``plaita.store.streams.levels``)
lease, fence           ``plaita:execution:lease:T:<id>``, ``…fence:T:<id>``
lease generations      ``plaita:executions:lease-generation:T`` (lease format v2)
crash strikes          ``plaita:execution:crashes:T:<id>``
state, cancel flag     ``plaita:execution:T:<id>``, ``…cancel:T:<id>``
published events       ``plaita:execution:events:T:<id>``
start dedup            ``plaita:start-dedup:T:<key>``
version wait           ``plaita:execution:version-wait:T:<id>``
status index           ``plaita:executions:status:T:<status>``
suspension deadlines   ``plaita:executions:deadlines:T``
=====================  ==============================================

Tenants. ``ns`` is ``plaita`` for the default tenant (a body without ``tenant_id``, or with ``""`` or
``"default"``) and ``plaita:<tenant_id>`` for any other, as in the original: tenant ``t1``'s state is
``plaita:t1:execution:<id>`` (tagged ``plaita:t1:execution:T:<id>``: the tag is the partition's, so
one tenant's execution keeps all its keys in one slot). Every execution-scoped key above, the status
and deadline indexes, the fan-out done sets and the keeper's retry marks live in the tenant's ns
(``Keyspace.for_tenant``); the streams, DLQ, registry, control channels, keeper lease and schedules
are the platform's and are not per tenant. ``TENANTS_KEY`` lists the tenants that have executions,
so the keeper finds every one.

Ids in keys. A user-chosen id (an execution id, a child's id, a dedup key) is written into a key as
``key_id(id)``: the id itself when it holds neither ``:`` nor ``%`` (every plain id keeps the original
bytes), else the id with ``%`` written ``%25`` and ``:`` written ``%3A``. So the id part of a key never
holds a ``:``, and a key splits at its colons into exactly one (namespace, kind, id): ``cancel:victim``
is ``plaita:execution:cancel%3Avictim``, never ``victim``'s cancel flag, and a default-tenant id can
never reach into another tenant's namespace (a tenant id holds no ``:`` either, ``plaita.tasks.TENANT_ID``).
``id_of_key`` is the inverse; a property test (tests/store/test_key_ids.py) shows no two (tenant, id)
pairs share any key.
Keys written before this layout for ids with ``:`` or ``%`` are moved by ``plaita migrate ids``.

An execution belongs to partition ``crc32(utf-8 id) % partitions`` (zlib's CRC-32, so a producer
in any language routes the same way). A task without an ``execution_id`` is keyed by its message
id, which a partitioned queue qualifies as ``<partition>/<stream id>`` so ids of different
streams never collide; such a name belongs to the partition it names. An entry of priority level
L > 0 is ``<L>/<stream id>`` within its partition (``<partition>/<L>/<stream id>`` partitioned):
level 0 keeps today's ids, and the lease key of a task without an execution id names its level.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import zlib
from dataclasses import dataclass
from functools import cached_property

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from plaita.tasks import DEFAULT_NS, tenant_ns

LEASE_PREFIX = "plaita:execution:lease:"
FENCE_PREFIX = "plaita:execution:fence:"
EXECUTION_PREFIX = "plaita:execution:"
CANCEL_PREFIX = "plaita:execution:cancel:"
EVENTS_PREFIX = "plaita:execution:events:"
#: Crash strikes of an execution (or of a task without one), ``plaita.store.executions.crashes``.
CRASHES_PREFIX = "plaita:execution:crashes:"
DEDUP_PREFIX = "plaita:start-dedup:"
#: When a start asking for a version no live worker runs began to wait (``plaita.store.executions.queued``).
VERSION_WAIT_PREFIX = "plaita:execution:version-wait:"
STATUS_PREFIX = "plaita:executions:status:"
DEADLINES_KEY = "plaita:executions:deadlines"
#: How long each writer's status index keeps ended entries (``checkpoint_execution``'s trim).
INDEX_KEEPS_KEY = "plaita:executions:index-keeps"
#: The last generation a v2 lease acquire handed out in a partition (``plaita.store.leases``).
GENERATION_KEY = "plaita:executions:lease-generation"
#: A set of the tenant ids (not the default one) whose executions were created: the keeper reads it.
TENANTS_KEY = "plaita:tenants"

_QUALIFIED = re.compile(r"(\d+)/(?:[1-9]/)?(\d+-\d+)")
#: Highest priority level (``priority=0..9``; 0, the default, is the queue's own stream).
PRIORITY_MAX = 9
#: A priority level's stream: ``<stream>:prio<L>``; the set of levels in use: ``<stream>:prio-levels``.
LEVEL_SUFFIX = ":prio"
LEVELS_SUFFIX = ":prio-levels"
#: Suffixes tried per partition for a tag whose slot falls in the partition's share of the slots.
_TAG_SEARCH = 10_000


def key_id(name: str) -> str:
    """``name`` as it is written into a key: unchanged unless it holds ``:`` or ``%`` (see above)."""
    if ":" in name or "%" in name:
        return name.replace("%", "%25").replace(":", "%3A")
    return name


def key_id_bytes(name: bytes) -> bytes:
    """``key_id`` of an id read as bytes (a body's execution id that need not be UTF-8)."""
    if b":" in name or b"%" in name:
        return name.replace(b"%", b"%25").replace(b":", b"%3A")
    return name


def id_of_key(part: str) -> str:
    """The id a key's id part names: the inverse of ``key_id``."""
    return part.replace("%3A", ":").replace("%25", "%") if "%" in part else part


def check_priority(priority: object) -> int:
    """``priority`` if it is an int within 0..9, else ValueError (a bool is refused too)."""
    if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= PRIORITY_MAX:
        raise ValueError(f"priority must be an int within 0..{PRIORITY_MAX} (higher runs first), not {priority!r}")
    return priority


def level_stream(stream: str, level: int) -> str:
    """The stream of priority ``level`` beside ``stream`` (its hash tag, so its slot); 0: ``stream``."""
    return stream if level == 0 else f"{stream}{LEVEL_SUFFIX}{level}"


def levels_key(stream: str) -> str:
    """The set of the priority levels producers used on ``stream`` (workers read it)."""
    return stream + LEVELS_SUFFIX


def split_level(message_id: str) -> tuple[int, str]:
    """(level, stream id) of a message id within one partition: ``<L>/<id>`` for L in 1..9, else level 0."""
    head, sep, rest = message_id.partition("/")
    if sep and len(head) == 1 and "1" <= head <= "9":
        return int(head), rest
    return 0, message_id


def hash_tag(key: str) -> str:
    """The ``{…}`` part Redis Cluster hashes (the first non-empty one, braces included), or ""."""
    start = key.find("{")
    end = key.find("}", start + 1)
    return key[start : end + 1] if start != -1 and end > start + 1 else ""


def partition_tag(index: int, partitions: int) -> str:
    """The hash tag of partition ``index``: ``{p<i>}``, or ``{p<i>.<k>}`` with the smallest ``k``
    whose slot falls in the ``index``-th equal share of the 16384 slots. A cluster created with
    ``redis-cli --cluster create`` splits the slots into equal ranges, so N partitions spread
    evenly over the masters instead of where CRC16 happens to put ``p0…p5``."""
    low = index * REDIS_CLUSTER_HASH_SLOTS // partitions
    high = (index + 1) * REDIS_CLUSTER_HASH_SLOTS // partitions
    for k in range(_TAG_SEARCH):
        body = f"p{index}" if k == 0 else f"p{index}.{k}"
        if low <= key_slot(body.encode()) < high:
            return "{" + body + "}"
    return "{" + f"p{index}" + "}"  # pragma: no cover - 10000 tries always find one


@dataclass(frozen=True)
class Keyspace:
    """The keys of one queue and of the executions it carries."""

    queue: str
    partitions: int = 1
    #: Hash-tagged keys: on Redis Cluster (even with one partition) or with partitions > 1.
    tagged: bool = False
    #: ``--dlq-key``; empty = ``<queue>:dlq`` (per partition ``<queue>:T:dlq``).
    dlq_key: str = ""
    #: The tenant's namespace of every execution-scoped key: ``plaita`` (default tenant) or
    #: ``plaita:<tenant_id>``; see ``for_tenant``.
    ns: str = DEFAULT_NS

    @property
    def tenant(self) -> str:
        """The tenant id of this keyspace; "" for the default tenant."""
        return self.ns[len(DEFAULT_NS) + 1 :]

    def for_tenant(self, tenant_id: str | None) -> Keyspace:
        """The same queue's keys in ``tenant_id``'s namespace (None, "" or "default": the default
        tenant). ValueError for an id that is not a valid tenant id (``plaita.tasks.tenant_ns``)."""
        return _for_tenant(self, tenant_ns(tenant_id))

    @cached_property
    def tags(self) -> tuple[str, ...]:
        if not self.tagged:
            return ("",)
        return tuple(partition_tag(i, self.partitions) for i in range(self.partitions))

    def _t(self, p: int) -> str:
        return f"{self.tags[p]}:" if self.tagged else ""

    # -- partitions ------------------------------------------------------------------------
    def partition_of(self, name: str) -> int:
        """The partition of an execution id (or of a qualified message id)."""
        if self.partitions == 1:
            return 0
        m = _QUALIFIED.fullmatch(name)
        if m is not None and int(m.group(1)) < self.partitions:
            return int(m.group(1))
        return zlib.crc32(name.encode("utf-8", "surrogateescape")) % self.partitions

    def home_of_misrouted(self, qualified: str, execution_id: str | None) -> int | None:
        """The partition ``execution_id`` belongs to when the entry ``qualified`` sits on another
        one (a producer that did not route), else None."""
        if self.partitions == 1 or not execution_id:
            return None
        home = self.partition_of(execution_id)
        return home if home != self.unqualify(qualified)[0] else None

    def qualify(self, p: int, message_id: str) -> str:
        return f"{p}/{message_id}" if self.tagged else message_id

    def unqualify(self, qualified: str) -> tuple[int, str]:
        """(partition, stream id) of a qualified message id; ValueError when it is not one."""
        if not self.tagged:
            return 0, qualified
        p, sep, mid = qualified.partition("/")
        if not sep or not p.isdigit() or int(p) >= self.partitions:
            raise ValueError(f"not a message id of this queue: {qualified!r}")
        return int(p), mid

    # -- keys ------------------------------------------------------------------------------
    def stream(self, p: int) -> str:
        return f"{self.queue}:{self.tags[p]}" if self.tagged else self.queue

    def dlq(self, p: int) -> str:
        if not self.tagged:
            return self.dlq_key or f"{self.queue}:dlq"
        return f"{self.dlq_key}:{self.tags[p]}" if self.dlq_key else f"{self.stream(p)}:dlq"

    def named(self, default_name: str) -> str:
        """A ``plaita:…`` key name (or prefix) of the default tenant, in this keyspace's ns."""
        return default_name if self.ns == DEFAULT_NS else self.ns + default_name[len(DEFAULT_NS) :]

    def lease_prefix(self, p: int) -> str:
        return self.named(LEASE_PREFIX) + self._t(p)

    def lease_key(self, name: str) -> str:
        return self.lease_prefix(self.partition_of(name)) + key_id(name)

    def fence_key(self, name: str) -> str:
        return self.named(FENCE_PREFIX) + self._t(self.partition_of(name)) + key_id(name)

    def lease_and_fence_keys(self, names: list[str]) -> tuple[list[str], list[str]]:
        """``lease_key`` and ``fence_key`` of every name. Untagged (or with one partition) each is
        a fixed prefix + the name: the prefixes are built once for a read batch, not per task."""
        if self.tagged and self.partitions > 1:
            return [self.lease_key(n) for n in names], [self.fence_key(n) for n in names]
        lease, fence = self._untagged_prefixes
        # One scan of the whole batch, not a key_id call per name: ids rarely hold ':' or '%'.
        joined = "".join(names)
        ids = [key_id(n) for n in names] if ":" in joined or "%" in joined else names
        return [lease + n for n in ids], [fence + n for n in ids]

    @cached_property
    def _untagged_prefixes(self) -> tuple[str, str]:
        """The lease and fence key prefixes of partition 0 (built once, not per read batch)."""
        return self.lease_prefix(0), self.named(FENCE_PREFIX) + self._t(0)

    def execution_key(self, execution_id: str) -> str:
        return self.named(EXECUTION_PREFIX) + self._t(self.partition_of(execution_id)) + key_id(execution_id)

    def cancel_key(self, execution_id: str) -> str:
        return self.named(CANCEL_PREFIX) + self._t(self.partition_of(execution_id)) + key_id(execution_id)

    def events_key(self, execution_id: str) -> str:
        """The hash of what the execution's steps published (``ctx.publish``)."""
        return self.named(EVENTS_PREFIX) + self._t(self.partition_of(execution_id)) + key_id(execution_id)

    def own_keys(self, execution_id: str) -> tuple[str, str, str, str, str]:
        """(``lease_key``, ``fence_key``, ``execution_key``, ``cancel_key``, ``events_key``) of an
        execution, from prefixes built once per partition: every checkpoint and create names
        them, and building each from its parts cost a checkpoint about 3 µs."""
        lease, fence, state, cancel, events = self._own_prefixes[self.partition_of(execution_id)]
        kid = key_id(execution_id)
        return lease + kid, fence + kid, state + kid, cancel + kid, events + kid

    @cached_property
    def _own_prefixes(self) -> tuple[tuple[str, str, str, str, str], ...]:
        """Per partition, the prefixes of ``own_keys`` (the same parts as each key's method)."""
        return tuple(
            (
                self.lease_prefix(p),
                self.named(FENCE_PREFIX) + self._t(p),
                self.named(EXECUTION_PREFIX) + self._t(p),
                self.named(CANCEL_PREFIX) + self._t(p),
                self.named(EVENTS_PREFIX) + self._t(p),
            )
            for p in range(self.partitions)
        )

    def crashes_key(self, name: str) -> str:
        """The crash strikes of an execution id (or of a task's qualified message id)."""
        return self.named(CRASHES_PREFIX) + self._t(self.partition_of(name)) + key_id(name)

    def version_wait_key(self, execution_id: str) -> str:
        """Since when a start of ``execution_id`` waits for a worker of the version it asks for."""
        return self.named(VERSION_WAIT_PREFIX) + self._t(self.partition_of(execution_id)) + key_id(execution_id)

    def dedup_key(self, p: int, key: str) -> str:
        return self.named(DEDUP_PREFIX) + self._t(p) + key_id(key)

    def status_key(self, p: int, status: str) -> str:
        return self.named(STATUS_PREFIX) + self._t(p) + status

    def generation_key(self, p: int) -> str:
        """Partition ``p``'s lease generation counter (one key, no TTL; lease format v2)."""
        key = self.named(GENERATION_KEY)
        return f"{key}:{self.tags[p]}" if self.tagged else key

    def deadlines_key(self, p: int) -> str:
        key = self.named(DEADLINES_KEY)
        return f"{key}:{self.tags[p]}" if self.tagged else key

    def index_keeps_key(self, p: int) -> str:
        key = self.named(INDEX_KEEPS_KEY)
        return f"{key}:{self.tags[p]}" if self.tagged else key

    def slot_tag(self, execution_id: str) -> str:
        """The hash tag a key must carry to be written with this execution's checkpoint ("" untagged)."""
        return self.tags[self.partition_of(execution_id)] if self.tagged else ""


def tenant_prefix(prefix: str, tenant: bytes) -> bytes:
    """``prefix`` (a default-tenant ``plaita:…`` prefix, say a partition's lease prefix) in the ns of
    ``tenant``, a body's raw ``tenant_id``. An invalid one keeps the default prefix: its task never
    takes a lease (the worker dead-letters it), so its entry is claimed and goes to the DLQ."""
    try:
        ns = tenant_ns(bytes(tenant).decode("utf-8")) if tenant else DEFAULT_NS
    except (UnicodeDecodeError, ValueError):
        ns = DEFAULT_NS
    if ns == DEFAULT_NS or not prefix.startswith(DEFAULT_NS + ":"):
        return prefix.encode()
    return (ns + prefix[len(DEFAULT_NS) :]).encode()


@functools.lru_cache(maxsize=4096)
def _for_tenant(ks: Keyspace, ns: str) -> Keyspace:
    # Cached: the worker asks once per task; a keyspace is frozen (hashable) and small.
    return ks if ks.ns == ns else dataclasses.replace(ks, ns=ns)


#: The untagged keys existing deployments use: one stream, nothing tagged.
DEFAULT = Keyspace("plaita:flow:queue")
