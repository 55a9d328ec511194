"""Execution leases with fencing generations (design.md §6).

A lease ``plaita:execution:lease:{execution_id}`` holds ``{holder}:{generation}`` with a PX
TTL. The generation comes from ``plaita:execution:fence:{execution_id}`` (INCR on every
acquire), so a worker that was paused past its TTL and wakes up holds an older generation
than its successor and ``fenced_set`` refuses its writes. Renewal is compare-and-extend,
release is compare-and-delete, both in Lua so a lease is never touched by a non-holder.

The holder is ``worker:{consumer}@{incarnation}``: a restarted worker with the same stable
consumer name recognises its previous incarnation's leases and takes them over at once
(the old process is gone: consumer names are unique per live process).
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Any

import redis
from redis.client import Pipeline

from plaita.store import scripts as lua

logger = logging.getLogger(__name__)

#: Prefix of execution lease keys (compatible with the original plaita).
LEASE_PREFIX = "plaita:execution:lease:"
#: Prefix of fencing generation counters.
FENCE_PREFIX = "plaita:execution:fence:"
#: Fencing counters outlive any lease: 7 days, as the original.
FENCE_TTL_S = 7 * 24 * 3600

# KEYS: lease, fence (pairs, one per execution). ARGV: holder, ttl_ms, fence_ttl_s, takeover_prefix.
# For each pair: {1, generation} when acquired, {0, current_value} when another holder has it.
# One call per read batch: a per-task EVALSHA costs a client round of packing and parsing each.
ACQUIRE_MANY = lua.Lua("""
local out = {}
for i = 1, #KEYS, 2 do
  local cur = redis.call('GET', KEYS[i])
  if cur and (string.sub(cur, 1, string.len(ARGV[4])) ~= ARGV[4]
      -- Take over only a previous incarnation's lease, never one this incarnation holds (a
      -- second task of the same execution on this worker must wait like on any other worker).
      or string.sub(cur, 1, string.len(ARGV[1]) + 1) == ARGV[1] .. ':') then
    table.insert(out, 0)
    table.insert(out, cur)
  else
    local gen = redis.call('INCR', KEYS[i + 1])
    redis.call('EXPIRE', KEYS[i + 1], tonumber(ARGV[3]))
    redis.call('SET', KEYS[i], ARGV[1] .. ':' .. gen, 'PX', tonumber(ARGV[2]))
    table.insert(out, 1)
    table.insert(out, gen)
  end
end
return out
""")

# KEYS: lease keys. ARGV: the value each must still hold. Compare-and-delete each; returns count.
RELEASE_MANY = lua.Lua("""
local n = 0
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[i] then
    n = n + redis.call('DEL', KEYS[i])
  end
end
return n
""")


# KEYS: lease. ARGV: holder. Deletes a lease this incarnation holds under any generation.
_RELEASE_ORPHAN = """
local cur = redis.call('GET', KEYS[1])
if cur and string.sub(cur, 1, string.len(ARGV[1]) + 1) == ARGV[1] .. ':' then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

# KEYS: lease. ARGV: value, ttl_ms. 1 = extended, 0 = lost.
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]))
end
return 0
"""

# KEYS: lease. ARGV: value. 1 = released, 0 = not ours (anymore). Also queued by
# StreamQueue inside its settle and hand-back transactions.
RELEASE = lua.Lua("""
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
""")

# KEYS: lease, fence, target. ARGV: generation, value.
# Writes only while the lease is held by exactly this generation and no newer one exists.
_FENCED_SET = """
local cur = redis.call('GET', KEYS[1])
local fence = tonumber(redis.call('GET', KEYS[2]) or '0')
if fence ~= tonumber(ARGV[1]) or not cur then return 0 end
local suffix = ':' .. ARGV[1]
if string.sub(cur, -string.len(suffix)) ~= suffix then return 0 end
redis.call('SET', KEYS[3], ARGV[2])
return 1
"""


def lease_key(execution_id: str) -> str:
    return f"{LEASE_PREFIX}{execution_id}"


def fence_key(execution_id: str) -> str:
    return f"{FENCE_PREFIX}{execution_id}"


@dataclass(frozen=True)
class Lease:
    """A held lease: its key, the exact value we wrote, and its fencing generation."""

    execution_id: str
    key: str
    value: str
    generation: int


class LeaseManager:
    """Acquire, renew and release execution leases for one worker incarnation."""

    def __init__(self, client: redis.Redis, *, consumer: str, ttl_s: float) -> None:
        self.client = client
        self.ttl_ms = max(1, int(ttl_s * 1000))
        self.takeover_prefix = f"worker:{consumer}@"
        self.holder = f"{self.takeover_prefix}{uuid.uuid4().hex[:12]}"
        self._renew = client.register_script(_RENEW)
        self.release_script = client.register_script(RELEASE.source)
        self._release_orphan = client.register_script(_RELEASE_ORPHAN)

    def acquire(self, execution_id: str) -> Lease | str:
        """The lease, or the current holder's value when another live holder has it."""
        return self.acquire_many([execution_id])[0]

    def acquire_many(self, execution_ids: list[str]) -> list[Lease | str]:
        """``acquire`` for a whole read batch in one pipelined round trip (in order)."""
        if not execution_ids:
            return []
        keys = [k for execution_id in execution_ids for k in (lease_key(execution_id), fence_key(execution_id))]
        args = [self.holder, self.ttl_ms, FENCE_TTL_S, self.takeover_prefix]

        def build(pipe: Pipeline) -> None:
            ACQUIRE_MANY.queue(pipe, keys, args)

        # A NOSCRIPT reply means no acquire ran, so running the batch again is safe.
        [flat] = lua.execute(self.client, build, [ACQUIRE_MANY], transaction=False)
        replies = list(zip(flat[0::2], flat[1::2], strict=True))
        out: list[Lease | str] = []
        for execution_id, (ok, value) in zip(execution_ids, replies, strict=True):
            if int(ok) != 1:
                out.append(value.decode() if isinstance(value, bytes) else str(value))
            else:
                generation = int(value)
                out.append(Lease(execution_id, lease_key(execution_id), f"{self.holder}:{generation}", generation))
        return out

    def renew_many(self, leases: list[Lease]) -> list[bool]:
        """Compare-and-extend every lease in one round trip; False = lost."""
        if not leases:
            return []
        pipe = self.client.pipeline(transaction=False)
        for lease in leases:
            self._renew(keys=[lease.key], args=[lease.value, self.ttl_ms], client=pipe)
        return [int(r) == 1 for r in pipe.execute()]

    def release_orphan(self, execution_id: str) -> bool:
        """Delete this incarnation's lease of ``execution_id``, whatever its generation.

        For an acquire whose reply was lost (timeout, reset): Redis may have set the lease
        anyway, and nothing would renew or release it, so the task's entry could not be
        reclaimed (nor the lease re-acquired by us) for a whole TTL. Call it only while no
        task of that execution is in flight here. True if a lease was deleted.
        """
        return int(self._release_orphan(keys=[lease_key(execution_id)], args=[self.holder])) == 1

    def release(self, lease: Lease, pipe: Any = None) -> Any:
        """Compare-and-delete (optionally queued on ``pipe``)."""
        return self.release_script(keys=[lease.key], args=[lease.value], client=pipe)


def fenced_set(client: redis.Redis, execution_id: str, generation: int, key: str, value: str) -> bool:
    """SET ``key`` only while ``generation`` still holds the execution's lease.

    A handler writes execution state through this (``task.fencing_token``); a worker whose
    lease expired or was taken over gets False and must stop.
    """
    script = client.register_script(_FENCED_SET)
    result = script(keys=[lease_key(execution_id), fence_key(execution_id), key], args=[generation, value])
    return int(result) == 1
