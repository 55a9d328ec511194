"""Fleet-wide limits of a flow: its concurrency slots and its start rate, in Redis.

Keys, one hash tag per (queue, flow) so every script stays in one slot on Redis Cluster, apart
from the partitions' tags (a flow's executions live in every partition; its limit spans them):

- ``plaita:flow-limit:{<queue>:<flow_id>}:slots``: zset, member = execution id, score = when
  its slot expires (server ms). A holder renews it every ttl/3; a dead one's slot is pruned by
  the next acquire once its score passes, so a crashed worker's slots come back within the ttl.
- ``…:owners``: hash, execution id -> token of the task holding the slot, so only that task
  renews or gives it back (the execution's next task, after a crash, takes it over).
- ``…:starts``: hash ``{tokens, at_ms}``, a token bucket of the flow's starts.

Times come from the server (``TIME`` inside the scripts): workers' clocks never matter.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import redis
from redis.client import Pipeline

from plaita.store import scripts
from plaita.store.keyspace import Keyspace

logger = logging.getLogger(__name__)

LIMIT_PREFIX = "plaita:flow-limit:"
_ACQUIRE = scripts.script("acquire_flow_slot")
_RELEASE = scripts.script("release_flow_slot")
_RENEW = scripts.script("renew_flow_slots")

#: ``acquire`` replies.
TAKEN, FULL, RATE_LIMITED = 1, 0, 2


@dataclass(frozen=True)
class Admit:
    """The answer to one acquire: ``code`` (TAKEN, FULL, RATE_LIMITED) and, when rate limited,
    how long until the next start token (seconds)."""

    code: int
    wait_s: float = 0.0


def limit_keys(ks: Keyspace, flow_id: str) -> tuple[str, str, str]:
    """The slot set, owners and start bucket of ``flow_id`` on ``ks``'s queue (one hash tag)."""
    base = f"{LIMIT_PREFIX}{{{ks.queue}:{flow_id}}}:"
    return base + "slots", base + "owners", base + "starts"


class FlowLimitStore:
    """Acquire, renew and release flow slots; take start tokens."""

    def __init__(self, client: redis.Redis, ks: Keyspace) -> None:
        self.client = client
        self.ks = ks

    def acquire(
        self,
        flow_id: str,
        execution_id: str,
        token: str,
        *,
        max_concurrent: int,
        ttl_s: float,
        starts_per_s: float,
        burst: float,
    ) -> Admit:
        """One atomic check of both limits (0 = that limit is off): a slot is taken only with
        the start token, and a start token only with the slot. Safe to run twice (NOSCRIPT)."""
        reply = _ACQUIRE(
            self.client,
            limit_keys(self.ks, flow_id),
            [execution_id, token, max_concurrent, _ms(ttl_s), repr(float(starts_per_s)), repr(float(burst))],
        )
        code, wait_ms = int(reply[0]), int(reply[1])
        return Admit(code, wait_ms / 1000)

    def release(self, flow_id: str, execution_id: str, token: str) -> bool:
        """Give the slot back (only if ``token`` still holds it); True if it did."""
        slots, owners, _ = limit_keys(self.ks, flow_id)
        return int(_RELEASE(self.client, [slots, owners], [execution_id, token])) == 1

    def renew(self, held: Sequence[tuple[str, str, str]], ttl_s: float) -> list[bool]:
        """Extend every (flow id, execution id, token) slot; False where it was lost. One script
        call per flow (its own slot), pipelined: compare-and-extend is safe to run twice."""
        by_flow: dict[str, list[int]] = {}
        for i, (flow_id, _, _) in enumerate(held):
            by_flow.setdefault(flow_id, []).append(i)
        if not by_flow:
            return []

        def build(pipe: Pipeline) -> None:
            for flow_id, members in by_flow.items():
                slots, owners, _ = limit_keys(self.ks, flow_id)
                pairs = [x for i in members for x in (held[i][1], held[i][2])]
                _RENEW.queue(pipe, [slots, owners], [_ms(ttl_s), *pairs])

        replies = scripts.execute(self.client, build, [_RENEW], transaction=False)
        out = [False] * len(held)
        for members, flat in zip(by_flow.values(), replies, strict=True):
            for i, ok in zip(members, flat, strict=True):
                out[i] = int(ok) == 1
        return out

    def holders(self, flow_id: str) -> int:
        """How many slots of ``flow_id`` are held now (expired ones not counted)."""
        slots, _, _ = limit_keys(self.ks, flow_id)
        now_s, micros = self.client.time()
        return int(self.client.zcount(slots, f"({now_s * 1000 + micros // 1000}", "+inf"))


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))
