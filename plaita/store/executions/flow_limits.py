"""Fleet-wide limits of a flow: its concurrency slots, its start rates and its parked starts, in Redis.

Keys, one hash tag per (queue, flow) so every script stays in one slot on Redis Cluster, apart
from the partitions' tags (a flow's executions live in every partition; its limit spans them):

- ``plaita:flow-limit:{<queue>:<flow_id>}:slots``: zset, member = execution, score = when its
  slot expires (server ms). A holder renews it every ttl/3; a dead one's slot is pruned by the
  next script once its score passes, so a crashed worker's slots come back within the ttl.
- ``…:owners``: hash, execution -> token of the task holding the slot, so only that task renews
  or gives it back (the execution's next task, after a crash, takes it over); ``~promoted`` for a
  slot reserved for a parked start.
- ``…:starts``: hash ``{tokens, at_ms}``, a token bucket of the flow's starts (``max_starts_per_s``).
- ``…:window``: zset of the start times of the last ``rate_limit`` period (one member per start).
- ``…:parked``, ``…:parked-tasks`` and ``…:parked-deadlines``: starts waiting for a slot, in
  order of their start (zset, score from the start's stream id), their task bodies (hash) and the
  deadlines of those that have one (zset, epoch ms: the sweep puts a start back once its deadline
  passed, so it ends ``cancelled`` without waiting for its turn). They never expire.
- ``…:limits``: hash, the run-time limits ``plaita limits set`` wrote (``max_concurrent``,
  ``max_starts_per_s``, ``max_concurrent_per_key``): the scripts read it themselves, so a change
  holds at the next acquire, release or sweep of every worker, with no restart and no polling.
- ``…:key:<k>:slots``, ``…:key:<k>:owners``, ``…:key:<k>:parked``: a concurrency key's own slots
  and parked starts (``max_concurrent_per_key``), ``<k>`` the key escaped (``key_scope``); the
  bodies and deadlines of its parked starts live in the flow's hashes above (execution ids are
  unique). ``…:parked-keys``: set of the keys with parked starts, for the sweep.
- ``plaita:flow-limit:{<queue>}:parking``: set of the flows that ever parked a start, so a cancel
  finds a parked start by its execution id alone; ``…{<queue>}:limited``: set of the flows with
  run-time limits (``plaita limits show``).

Times come from the server (``TIME`` inside the scripts): workers' clocks never matter.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis
from redis.client import Pipeline

from plaita.store import scripts
from plaita.store.executions.fanout import enqueue_tasks
from plaita.store.keyspace import Keyspace, key_id
from plaita.store.streams.entries import as_text

logger = logging.getLogger(__name__)

LIMIT_PREFIX = "plaita:flow-limit:"
#: The owner token of a slot reserved for a parked start (no task's token: tokens are uuid hex).
PROMOTED = "~promoted"
_ACQUIRE = scripts.script("acquire_flow_slot")
_RELEASE = scripts.script("release_flow_slot")
_RENEW = scripts.script("renew_flow_slots")
_PROMOTE = scripts.script("promote_parked")

#: Parked starts past their deadline one sweep puts back at most (a bound, not a policy).
SWEEP_DEADLINES_MAX = 100
#: Concurrency keys with parked starts one sweep visits at most (picked at random each round).
SWEEP_KEYS_MAX = 100
#: A concurrency key longer than this is named by its SHA-256 in key names (``key_scope``).
KEY_NAME_MAX = 100
#: ``acquire`` replies.
TAKEN, FULL, RATE_LIMITED, PARKED = 1, 0, 2, 3


@dataclass(frozen=True)
class Admit:
    """The answer to one acquire: ``code`` (TAKEN, FULL, RATE_LIMITED, PARKED) and, when rate
    limited, how long until the next start may pass (seconds)."""

    code: int
    wait_s: float = 0.0


@dataclass(frozen=True)
class FlowKeys:
    """The keys of one flow's limits (one hash tag)."""

    slots: str
    owners: str
    starts: str
    window: str
    parked: str
    parked_tasks: str
    parked_deadlines: str
    limits: str
    parked_keys: str
    #: ``key_scope`` of the concurrency key whose slots these are ("" = the flow's own).
    scope: str = ""

    @property
    def parking(self) -> list[str]:
        """The keys of the release script (the sweep's add ``parked_keys``)."""
        return [self.slots, self.owners, self.parked, self.parked_tasks, self.parked_deadlines, self.limits]


def flow_keys(ks: Keyspace, flow_id: str, key: str | None = None) -> FlowKeys:
    """The keys of ``flow_id``'s limits; with ``key``, the slots and parked starts are that
    concurrency key's (``max_concurrent_per_key``), the rest the flow's."""
    base = f"{LIMIT_PREFIX}{{{ks.queue}:{flow_id}}}:"
    names = ("slots", "owners", "starts", "window", "parked", "parked-tasks", "parked-deadlines", "limits")
    k = FlowKeys(*(base + n for n in (*names, "parked-keys")))
    return k if key is None else _scoped(k, key_scope(key))


def _scoped(k: FlowKeys, scope: str) -> FlowKeys:
    """``k`` with the slots and parked starts of the concurrency key named ``scope``."""
    own = f"{k.slots.removesuffix('slots')}key:{scope}:"
    return dataclasses.replace(k, slots=own + "slots", owners=own + "owners", parked=own + "parked", scope=scope)


def key_scope(key: str) -> str:
    """A concurrency key as it is written into key names: ``k=`` and the key with ``:`` and ``%``
    escaped (``key_id``), or ``h=`` and its SHA-256 when longer than KEY_NAME_MAX, so user data can
    neither run into another key's name nor make names of unbounded length."""
    if len(key) <= KEY_NAME_MAX:
        return "k=" + key_id(key)
    return "h=" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def limit_keys(ks: Keyspace, flow_id: str) -> tuple[str, str, str]:
    """The slot set, owners and start bucket of ``flow_id`` on ``ks``'s queue (one hash tag)."""
    k = flow_keys(ks, flow_id)
    return k.slots, k.owners, k.starts


def parking_index(ks: Keyspace) -> str:
    return f"{LIMIT_PREFIX}{{{ks.queue}}}:parking"


def limited_index(ks: Keyspace) -> str:
    """The set of the flows with run-time limits on ``ks``'s queue."""
    return f"{LIMIT_PREFIX}{{{ks.queue}}}:limited"


class FlowLimitStore:
    """Acquire, renew and release flow slots; take start tokens; park and promote starts."""

    def __init__(self, client: redis.Redis, ks: Keyspace) -> None:
        self.client = client
        self.ks = ks

    @classmethod
    def sharing(cls, store: Any) -> FlowLimitStore:
        """The flow limits on the client and keyspace of ``store`` (an ``ExecutionStore``)."""
        return cls(store.client, store.ks)

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
        window: tuple[int, float] | None = None,
        park: tuple[float, dict[str, Any], float | None] | None = None,
        key: str | None = None,
    ) -> Admit:
        """One atomic check of every limit (0 / None = that limit is off): a slot is taken only
        with the start's rates, and a rate only with the slot. ``park``: (order, task body,
        deadline in epoch seconds or None) of a start that parks when no slot is free (PARKED)
        instead of coming back FULL. ``key``: the slots are that concurrency key's and
        ``max_concurrent`` its limit. Safe to run twice (NOSCRIPT). Parked starts this call gave a
        slot to are put back on their streams."""
        k = flow_keys(self.ks, flow_id, key)
        window_n, window_s = window or (0, 0.0)
        order, body, deadline = "", "", ""
        if park is not None:
            order, body = repr(float(park[0])), json.dumps(park[1], separators=(",", ":"))
            deadline = "" if park[2] is None else str(int(park[2] * 1000))
        argv = [execution_id, token, max_concurrent, _ms(ttl_s), repr(float(starts_per_s)), repr(float(burst))]
        argv += [window_n, _ms(window_s) if window_n else 0, order, body, deadline, k.scope]
        keys = [k.slots, k.owners, k.starts, k.window, k.parked, k.parked_tasks, k.parked_deadlines, k.limits]
        keys.append(k.parked_keys)
        reply = _ACQUIRE(self.client, keys, argv)
        self._requeue(flow_id, reply[2:])
        return Admit(int(reply[0]), int(reply[1]) / 1000)

    def release(
        self,
        flow_id: str,
        execution_id: str,
        token: str,
        *,
        max_concurrent: int = 0,
        ttl_s: float = 0.0,
        key: str | None = None,
    ) -> bool:
        """Give the slot back (only if ``token`` still holds it); True if it did. The free slots go
        to the oldest parked starts (put back on their streams here)."""
        k = flow_keys(self.ks, flow_id, key)
        return self._release(flow_id, k, execution_id, token, max_concurrent, ttl_s, forget=False)

    def forget(
        self, flow_id: str, execution_id: str, *, max_concurrent: int, ttl_s: float, key: str | None = None
    ) -> None:
        """``execution_id``'s start waits no more (cancelled, past its deadline): drop it from the
        parked starts and give back a slot reserved for it."""
        k = flow_keys(self.ks, flow_id, key)
        self._release(flow_id, k, execution_id, PROMOTED, max_concurrent, ttl_s, forget=True)

    def _release(
        self, flow_id: str, k: FlowKeys, member: str, token: str, limit: int, ttl_s: float, *, forget: bool
    ) -> bool:
        argv = [member, token, limit, _ms(ttl_s), "1" if forget else "0", k.scope]
        reply = _RELEASE(self.client, k.parking, argv)
        self._requeue(flow_id, reply[1:])
        return int(reply[0]) == 1

    def promote(self, flow_id: str, *, max_concurrent: int, ttl_s: float, key: str | None = None) -> int:
        """The sweep: give ``flow_id``'s (or its concurrency ``key``'s) free slots to its oldest
        parked starts, and put them and (the flow's own sweep) those past their deadline back on
        their streams; how many starts are parked (the key's, or the whole flow's)."""
        k = flow_keys(self.ks, flow_id, key)
        deadlines_max = SWEEP_DEADLINES_MAX if key is None else 0
        argv = [max_concurrent, _ms(ttl_s), deadlines_max, k.scope]
        reply = _PROMOTE(self.client, [*k.parking, k.parked_keys], argv)
        self._requeue(flow_id, reply[1:])
        return int(reply[0])

    def parked_keys(self, flow_id: str) -> list[str]:
        """Up to SWEEP_KEYS_MAX of ``flow_id``'s concurrency keys with parked starts (a random
        pick when there are more, so every key is visited over a few sweeps), as ``key_scope``
        names them; ``promote_scope`` takes them back."""
        raw: list[bytes] = self.client.srandmember(flow_keys(self.ks, flow_id).parked_keys, SWEEP_KEYS_MAX)  # type: ignore[assignment]
        return [as_text(r) for r in raw or []]

    def promote_scope(self, flow_id: str, scope: str, *, max_concurrent: int, ttl_s: float) -> int:
        """``promote`` for the concurrency key named ``scope`` (from ``parked_keys``)."""
        k = _scoped(flow_keys(self.ks, flow_id), scope)
        reply = _PROMOTE(self.client, [*k.parking, k.parked_keys], [max_concurrent, _ms(ttl_s), 0, scope])
        self._requeue(flow_id, reply[1:])
        return int(reply[0])

    def _requeue(self, flow_id: str, raw: Sequence[Any]) -> None:
        """Put promoted parked starts back on their streams. Should this fail (or the process die
        first), their reservations expire and a later script promotes them again."""
        if not raw:
            return
        bodies = [json.loads(as_text(b)) for b in raw]
        try:
            enqueue_tasks(self.client, self.ks, bodies)
        except redis.RedisError as exc:  # the script's own answer still stands (a slot taken, given back)
            logger.warning(
                "could not put %d parked start(s) of flow %r back on their streams (%s: %s); they are "
                "promoted again once their reservations expire",
                len(bodies),
                flow_id,
                type(exc).__name__,
                exc,
            )
            return
        logger.debug("flow %r: %d parked start(s) given a slot", flow_id, len(bodies))

    def register_parking(self, flow_id: str) -> None:
        """Record that ``flow_id`` parks starts (before its first park), for ``parked_start``."""
        self.client.sadd(parking_index(self.ks), flow_id)

    def parked_start(self, member: str) -> dict[str, Any] | None:
        """The task body of ``member``'s parked start, whichever flow parked it; None if none did."""
        flows = sorted(as_text(f) for f in self.client.smembers(parking_index(self.ks)))
        for flow_id in flows:
            raw = self.client.hget(flow_keys(self.ks, flow_id).parked_tasks, member)
            if raw is not None:
                body: dict[str, Any] = json.loads(as_text(raw))
                return body
        return None

    def waiting(self, flow_id: str) -> int:
        """How many starts of ``flow_id`` wait for a slot (parked, or promoted and not running yet)."""
        return int(self.client.hlen(flow_keys(self.ks, flow_id).parked_tasks))

    def renew(self, held: Sequence[tuple[str, ...] | tuple[str, str, str, str | None]], ttl_s: float) -> list[bool]:
        """Extend every (flow id, execution id, token[, concurrency key]) slot; False where it was
        lost. One script call per flow and key (one slot), pipelined: compare-and-extend is safe
        to run twice."""
        by_flow: dict[tuple[str, str | None], list[int]] = {}
        for i, h in enumerate(held):
            by_flow.setdefault((h[0], h[3] if len(h) > 3 else None), []).append(i)
        if not by_flow:
            return []

        def build(pipe: Pipeline) -> None:
            for (flow_id, key), members in by_flow.items():
                k = flow_keys(self.ks, flow_id, key)
                slots, owners = k.slots, k.owners
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


def waiting_starts(client: redis.Redis, ks: Keyspace) -> dict[str, int]:
    """How many starts wait for a slot, by flow, for every flow of ``ks``'s queue that ever parked
    one (``plaita status``, the metrics, the dashboard): one SMEMBERS and one HLEN per flow (the
    parked bodies: every concurrency key's too)."""
    flows = sorted(as_text(f) for f in client.smembers(parking_index(ks)))
    pipe = client.pipeline(transaction=False)
    for flow_id in flows:
        pipe.hlen(flow_keys(ks, flow_id).parked_tasks)
    return {f: int(n) for f, n in zip(flows, pipe.execute() if flows else [], strict=True)}


def order_of(message_id: str) -> float:
    """A start's place in its flow's queue of parked starts: its stream id ``ms-seq`` as one number
    (``p/ms-seq`` on a partitioned queue), ``ms * 1000 + seq``, exact below 2**53."""
    ms, _, seq = message_id.rpartition("/")[2].partition("-")
    try:
        return float(int(ms) * 1000 + min(int(seq or 0), 999))
    except ValueError:
        return 0.0


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


#: Joins a tenant and an execution id in a slot's member name (tenant ids never hold it).
_SEP = "\x1f"


def member_of(tenant_id: str, execution_id: str) -> str:
    """``slot_member`` of tenant ``tenant_id``'s (``""``: the default tenant's) ``execution_id``."""
    if tenant_id:
        return f"{tenant_id}{_SEP}{execution_id}"
    return _SEP + execution_id if _SEP in execution_id else execution_id
