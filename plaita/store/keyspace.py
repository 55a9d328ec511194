"""Where every key of a queue lives: one partition is today's keys; more (or a cluster) are hash-tagged.

With one partition on one Redis every key keeps the untagged name existing deployments use (``<queue>``,
``plaita:execution:lease:<id>``, …). With ``partitions > 1`` or on Redis Cluster, partition ``i``
has a hash tag ``T = {p<i>}`` (``{p<i>.<k>}`` where that spreads better, see ``partition_tag``)
and every key that one atomic script touches carries it, so each script stays in one slot:

=====================  ==============================================
stream                 ``<queue>:T``            (DLQ ``<queue>:T:dlq``)
lease, fence           ``plaita:execution:lease:T:<id>``, ``…fence:T:<id>``
state, cancel flag     ``plaita:execution:T:<id>``, ``…cancel:T:<id>``
published events       ``plaita:execution:events:T:<id>``
start dedup            ``plaita:start-dedup:T:<key>``
status index           ``plaita:executions:status:T:<status>``
suspension deadlines   ``plaita:executions:deadlines:T``
=====================  ==============================================

An execution belongs to partition ``crc32(utf-8 id) % partitions`` (zlib's CRC-32, so a producer
in any language routes the same way). A task without an ``execution_id`` is keyed by its message
id, which a partitioned queue qualifies as ``<partition>/<stream id>`` so ids of different
streams never collide; such a name belongs to the partition it names.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass
from functools import cached_property

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

LEASE_PREFIX = "plaita:execution:lease:"
FENCE_PREFIX = "plaita:execution:fence:"
EXECUTION_PREFIX = "plaita:execution:"
CANCEL_PREFIX = "plaita:execution:cancel:"
EVENTS_PREFIX = "plaita:execution:events:"
DEDUP_PREFIX = "plaita:start-dedup:"
STATUS_PREFIX = "plaita:executions:status:"
DEADLINES_KEY = "plaita:executions:deadlines"

_QUALIFIED = re.compile(r"(\d+)/(\d+-\d+)")
#: Suffixes tried per partition for a tag whose slot falls in the partition's share of the slots.
_TAG_SEARCH = 10_000


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

    def lease_prefix(self, p: int) -> str:
        return LEASE_PREFIX + self._t(p)

    def lease_key(self, name: str) -> str:
        return self.lease_prefix(self.partition_of(name)) + name

    def fence_key(self, name: str) -> str:
        return FENCE_PREFIX + self._t(self.partition_of(name)) + name

    def execution_key(self, execution_id: str) -> str:
        return EXECUTION_PREFIX + self._t(self.partition_of(execution_id)) + execution_id

    def cancel_key(self, execution_id: str) -> str:
        return CANCEL_PREFIX + self._t(self.partition_of(execution_id)) + execution_id

    def events_key(self, execution_id: str) -> str:
        """The hash of what the execution's steps published (``ctx.publish``)."""
        return EVENTS_PREFIX + self._t(self.partition_of(execution_id)) + execution_id

    def dedup_key(self, p: int, key: str) -> str:
        return DEDUP_PREFIX + self._t(p) + key

    def status_key(self, p: int, status: str) -> str:
        return STATUS_PREFIX + self._t(p) + status

    def deadlines_key(self, p: int) -> str:
        return f"{DEADLINES_KEY}:{self.tags[p]}" if self.tagged else DEADLINES_KEY

    def slot_tag(self, execution_id: str) -> str:
        """The hash tag a key must carry to be written with this execution's checkpoint ("" untagged)."""
        return self.tags[self.partition_of(execution_id)] if self.tagged else ""


#: The untagged keys existing deployments use: one stream, nothing tagged.
DEFAULT = Keyspace("plaita:flow:queue")
