"""The smallest Redis ACLs plaita needs (docs/operations.md quotes these strings verbatim).

``WORKER_ACL_RULES`` lets ``plaita worker`` run its whole cycle: consume, ack, dead-letter,
leases (Lua), reclaim, housekeeping, hand-back, registry heartbeat and remote control.
``FLOW_WORKER_ACL_RULES`` adds what a flow worker (``--flows``: checkpoints, staged writes,
children, durable sleeps, ``ctx.publish``, fleet-wide limits, deadlines, tenants) and its
embedded keeper (``--keeper``: recovery, zombies, schedules) send, most of it inside the Lua
scripts (ACL checks each command a script runs); the standalone ``plaita keeper`` uses it too.
``PRODUCER_ACL_RULES`` lets ``FlowClient`` and ``plaita executions | enqueue`` start, resume,
cancel, retry, wait for, show and list executions: one script (a start: dedup answer, queued
record and XADD at once), plain commands otherwise, no channels.
``ADMIN_ACL_RULES`` covers the operator commands (``plaita workers | status | stop | pause |
resume | dlq | enqueue`` and the dashboard's actions, including cancelling and resuming
executions), ``DASHBOARD_READ_ACL_RULES`` the dashboard's read pages. All
confine keys and channels to the ``plaita:`` prefix; widen ``~plaita:*`` if ``--queue-name``
or ``--dlq-key`` live elsewhere. Needs Redis >= 7.0 (``command|subcommand`` rules).
Delayed tasks: a worker's reclaim pass moves them (a script: TYPE, ZRANGEBYSCORE, XADD, ZREM) and
its queue statistics count them (ZCARD); ``plaita enqueue --delay-s`` adds them (ZADD); a cancel of
a delayed start makes its task due now (ZRANGEBYSCORE, then ZADD XX).
Priorities: a producer SADDs a level it uses to ``<stream>:prio-levels``; a worker reads that set
(SMEMBERS; a worker refused it logs once and reads level 0 only), a cancel and the statistics too.
tests/ops/test_security.py proves the worker's and admin's suffice, tests/ops/test_flow_acl.py the
flow worker's and producer's, tests/dashboard the dashboard's.
"""

from __future__ import annotations

#: Rules for the worker's user: ``ACL SETUSER plaita-worker on >PASSWORD <rules>``.
WORKER_ACL_RULES = (
    "resetkeys ~plaita:* resetchannels &plaita:* -@all "
    "+xgroup|create +xgroup|delconsumer +xreadgroup +xack +xdel +xadd +xtrim +xclaim "
    "+xpending +xinfo|groups +xinfo|consumers +xrange +xlen "
    "+evalsha +script|load +script|exists "
    "+get +set +del +exists +incr +expire +pexpire +rpush +type +pttl +scan +mget "
    "+multi +exec +subscribe +client|setname +info +hset +hget +hdel "
    "+zcard +zrangebyscore +zrem +smembers"
)

#: Rules for a flow worker (``--flows``, with or without ``--keeper``) and ``plaita keeper``:
#: ``ACL SETUSER plaita-flow-worker on >PASSWORD <rules>``. The worker's, plus hashes (schedules,
#: events, staged writes), sets (tenants, children), sorted sets (status indexes, deadlines,
#: flow slots), INCRBY/PERSIST (staged writes, counters), TIME (limits and ticks),
#: SREM/SRANDMEMBER (the concurrency keys with parked starts) and WATCH/UNWATCH (the keeper's
#: compare-and-set on a zombie).
FLOW_WORKER_ACL_RULES = (
    WORKER_ACL_RULES + " +hexists +hlen +hmget +hgetall +hsetnx +incrby +persist +sadd +scard "
    "+srem +srandmember +zadd +zrange +zremrangebyscore +zscore +time +watch +unwatch"
)

#: Rules for a producer (``FlowClient``, ``plaita executions …``, ``plaita enqueue``):
#: ``ACL SETUSER plaita-producer on >PASSWORD <rules>``. XADD (tasks), GET/MGET (states, dedup),
#: SET (cancel flags), HGET/HGETALL (published events), ZREVRANGE/ZCARD/ZREVRANGEBYSCORE (listing
#: by cursor, counts), XRANGE
#: (a cancel of an id with no document looks for its start in the stream), SMEMBERS + HGET (... or
#: its parked start); EVALSHA and SCRIPT LOAD for the start's script, which runs TYPE, EXISTS, GET,
#: SET, ZADD, ZREMRANGEBYSCORE (expired queued records leave their index) and XADD; SADD (a
#: tenant's first start registers the tenant); ZRANGEBYSCORE (a cancel of a delayed start makes it due
#: now); no channels.
PRODUCER_ACL_RULES = (
    "resetkeys ~plaita:* resetchannels -@all +xadd +xrange +get +set +mget +hget +hgetall +zrevrange +zcard "
    "+evalsha +script|load +type +exists +zadd +zremrangebyscore +sadd +smembers +zrevrangebyscore +zrangebyscore"
)

#: Rules for an operator of flows (``plaita executions fork | delete | prune | cancel-many`` and
#: ``plaita schedules pause | resume | trigger | backfill``, and the same in Python): the
#: producer's, plus what removes and pauses, which the producer is deliberately refused: DEL and ZREM
#: (an execution's keys and its index entries), ZCOUNT (with the producer's ZRANGEBYSCORE, prune's
#: bounded walk of the status indexes by end time), ZRANGE, HSETNX/HDEL (a schedule's ``paused`` field). No channel.
FLOW_ADMIN_ACL_RULES = PRODUCER_ACL_RULES + " +del +zrem +zcount +zrange +hset +hsetnx +hdel"

#: Rules for an operator's user: ``ACL SETUSER plaita-admin on >PASSWORD <rules>``. The operator
#: changes flow limits at run time too (``plaita limits set | clear | show``): HSET/SADD/SREM of
#: the limits record, and the sweep script (EVALSHA: TYPE, ZRANGEBYSCORE, ZRANGE, ZSCORE, ZADD,
#: ZREM, HGET, HSET, HDEL, HLEN, SREM, PTTL, PEXPIRE, TIME) that gives a raised limit's slots to
#: parked starts, which it puts back on their streams (XADD).
ADMIN_ACL_RULES = (
    "resetkeys ~plaita:* resetchannels &plaita:* -@all "
    "+scan +mget +exists +xlen +xinfo|groups +xpending +xrange +xadd +xdel +del "
    "+multi +exec +publish +blpop +pubsub|numsub +get +set +zrevrange +zcard +hgetall +smembers +hlen "
    "+hset +hmget +sadd +srem +sunion +srandmember +time +zcount +evalsha +script|load +type +zrangebyscore "
    "+zrange +zscore +zadd +zrem +hget +hdel +pttl +pexpire +zrevrangebyscore"
)

#: Rules for a read-only dashboard (``plaita dashboard`` without ``--allow-actions``): registry,
#: queue statistics, the DLQ and executions pages, nothing that writes or publishes.
DASHBOARD_READ_ACL_RULES = (
    "resetkeys ~plaita:* resetchannels -@all +scan +mget +exists +xlen +xinfo|groups +xpending +xrange "
    "+get +zrevrange +zcard +hgetall +smembers +hlen +zrevrangebyscore"
)

#: The worker's rules under the name the issue uses.
MINIMAL_ACL_RULES = WORKER_ACL_RULES


def setuser_command(user: str, password: str, rules: str = WORKER_ACL_RULES) -> list[str]:
    """``["ACL", "SETUSER", user, "reset", "on", ">password", *rules]`` for ``execute_command``."""
    return ["ACL", "SETUSER", user, "reset", "on", f">{password}", *rules.split()]


__all__ = [
    "ADMIN_ACL_RULES",
    "DASHBOARD_READ_ACL_RULES",
    "FLOW_ADMIN_ACL_RULES",
    "FLOW_WORKER_ACL_RULES",
    "MINIMAL_ACL_RULES",
    "PRODUCER_ACL_RULES",
    "WORKER_ACL_RULES",
    "setuser_command",
]
