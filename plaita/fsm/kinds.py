"""The lifecycle's vocabulary of failures: what the worker does about an exception.

Only the words live here. Deciding which word an exception is (a Redis reply code, a
redis-py class, a socket error) is ``plaita.store.errors``: the lifecycle reacts to a kind
without knowing what Redis calls its errors.
"""

from __future__ import annotations

import enum


class ErrorKind(enum.Enum):
    """How the worker treats an exception."""

    #: Retry quietly with backoff; warn once per outage.
    TRANSIENT = "transient"
    #: Operator must act (auth, ACL, types); retry slowly, log an error every attempt.
    PERSISTENT = "persistent"
    #: The task itself is broken: DLQ it with a reason, never retry.
    BAD_INPUT = "bad_input"
    #: Not a Redis failure and not bad input (a handler bug, a programming error).
    NOT_OURS = "not_ours"
