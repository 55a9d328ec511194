"""The worker lifecycle as pure data and code: no Redis, no I/O.

``ErrorKind`` is its vocabulary of failures; which kind an exception is, is decided by
``plaita.store.errors``, the package that knows Redis.

``State`` and ``TRANSITIONS`` are the single source of truth; the runtime machine, the tests
and the diagrams are built from them.
"""

from plaita.fsm.backoff import BackoffPolicy
from plaita.fsm.kinds import ErrorKind
from plaita.fsm.machine import Lifecycle, build_machine
from plaita.fsm.states import ACTIVE_STATES, TERMINAL_STATES, State
from plaita.fsm.table import TRANSITIONS, triggers

__all__ = [
    "ACTIVE_STATES",
    "TERMINAL_STATES",
    "TRANSITIONS",
    "BackoffPolicy",
    "ErrorKind",
    "Lifecycle",
    "State",
    "build_machine",
    "triggers",
]
