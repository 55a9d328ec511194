"""The smallest Redis ACLs plaita needs (docs/operations.md quotes these strings verbatim).

``WORKER_ACL_RULES`` lets ``plaita worker`` run its whole cycle: consume, ack, dead-letter,
leases (Lua), reclaim, housekeeping, hand-back, registry heartbeat and remote control.
``ADMIN_ACL_RULES`` covers the operator commands (``plaita workers | status | stop | pause |
resume | dlq | enqueue`` and the dashboard's actions, including cancelling and resuming
executions), ``DASHBOARD_READ_ACL_RULES`` the dashboard's read pages. All
confine keys and channels to the ``plaita:`` prefix; widen ``~plaita:*`` if ``--queue-name``
or ``--dlq-key`` live elsewhere. Needs Redis >= 7.0 (``command|subcommand`` rules).
tests/ops/test_security.py proves the first two suffice, tests/dashboard the third.
"""

from __future__ import annotations

#: Rules for the worker's user: ``ACL SETUSER plaita-worker on >PASSWORD <rules>``.
WORKER_ACL_RULES = (
    "resetkeys ~plaita:* resetchannels &plaita:* -@all "
    "+xgroup|create +xgroup|delconsumer +xreadgroup +xack +xdel +xadd +xtrim +xclaim "
    "+xpending +xinfo|groups +xinfo|consumers +xrange +xlen "
    "+evalsha +script|load +script|exists "
    "+get +set +del +exists +incr +expire +pexpire +rpush +type +pttl +scan +mget "
    "+multi +exec +subscribe +client|setname +info"
)

#: Rules for an operator's user: ``ACL SETUSER plaita-admin on >PASSWORD <rules>``.
ADMIN_ACL_RULES = (
    "resetkeys ~plaita:* resetchannels &plaita:* -@all "
    "+scan +mget +exists +xlen +xinfo|groups +xpending +xrange +xadd +xdel +del "
    "+multi +exec +publish +blpop +pubsub|numsub +get +set +zrevrange +zcard +hgetall +smembers"
)

#: Rules for a read-only dashboard (``plaita dashboard`` without ``--allow-actions``): registry,
#: queue statistics, the DLQ and executions pages, nothing that writes or publishes.
DASHBOARD_READ_ACL_RULES = (
    "resetkeys ~plaita:* resetchannels -@all +scan +mget +exists +xlen +xinfo|groups +xpending +xrange "
    "+get +zrevrange +zcard +hgetall +smembers"
)

#: The worker's rules under the name the issue uses.
MINIMAL_ACL_RULES = WORKER_ACL_RULES


def setuser_command(user: str, password: str, rules: str = WORKER_ACL_RULES) -> list[str]:
    """``["ACL", "SETUSER", user, "reset", "on", ">password", *rules]`` for ``execute_command``."""
    return ["ACL", "SETUSER", user, "reset", "on", f">{password}", *rules.split()]


__all__ = ["ADMIN_ACL_RULES", "DASHBOARD_READ_ACL_RULES", "MINIMAL_ACL_RULES", "WORKER_ACL_RULES", "setuser_command"]
