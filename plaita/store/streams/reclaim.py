"""One bounded reclaim step: claim pending entries idle past ``min_idle_ms`` whose execution lease
is absent (``StreamQueue.claim_unleased`` and each partition's).

Two scripts: ``scan_claimable`` names each idle candidate's execution (read-only), and
``claim_unleased`` gets the candidates' lease keys in KEYS and checks each lease and claims in one
atomic call, so a holder cannot renew in between (XCLAIM's min-idle-time re-checks idleness
there too). One round trip when nothing is idle enough (every pass of a healthy fleet).

``count`` bounds the entries of *live* consumers claimed in one step (they run in the caller's
handler slots). With ``dead_ms`` the entries of a consumer silent that long do not count: a dead
worker's tasks are held as crash suspects and run one at a time (``plaita.runtime.suspects``),
so a caller can take all of them in one pass however few slots it has free.
"""

from __future__ import annotations

from typing import Any, Protocol

import redis

from plaita.store import scripts
from plaita.store.keyspace import key_id_bytes, tenant_prefix
from plaita.store.streams.entries import Entry, as_text
from plaita.tasks import decode_fields

_SCAN_CLAIMABLE = scripts.script("scan_claimable")
_CLAIM_UNLEASED = scripts.script("claim_unleased")
#: Pending entries one step examines at least (``count * 10`` when that is more): a step with one
#: free slot still walks a dead consumer's list in steps of this size.
MIN_SCAN = 100


class ClaimingQueue(Protocol):
    """What a claim needs of a ``StreamQueue``."""

    owner: redis.Redis
    stream: str
    group: str
    consumer: str
    id_prefix: str
    lease_prefix: str


def claim_unleased(
    q: ClaimingQueue, cursor: str, min_idle_ms: int, count: int, *, dead_ms: int = 0
) -> tuple[str, list[Entry], int]:
    """Returns (next cursor, claimed entries with their new delivery counts, entries skipped for a
    live lease). The cursor is ``0-0`` once the end of the pending list was reached."""
    scan = max(count * 10, MIN_SCAN if dead_ms > 0 else 0)
    found: list[Any] = _SCAN_CLAIMABLE(q.owner, [q.stream], [q.group, min_idle_ms, cursor, scan])
    if not found:
        return "0-0", [], 0
    own, prefix = q.id_prefix.encode(), q.lease_prefix
    # Keys stay bytes: an execution id that is not valid UTF-8 still names exactly its lease.
    # A tenant's lease is in its namespace (the body's tenant_id, see plaita.store.keyspace).
    lease_keys = [tenant_prefix(prefix, t) + (key_id_bytes(bytes(e)) if e else own + bytes(mid)) for mid, e, t in found]
    ids = [mid for mid, _, _ in found]
    reply: list[Any] = _CLAIM_UNLEASED(
        q.owner,
        [q.stream, *lease_keys],
        [q.group, q.consumer, min_idle_ms, count, scan, max(0, dead_ms), *ids],
    )
    entries = []
    for mid, flat, times_delivered, owner_idle_ms in reply[1]:
        fields, problems = decode_fields(list(flat))
        idle_ms = int(owner_idle_ms)
        entries.append(
            Entry(as_text(mid), fields, int(times_delivered), tuple(problems), idle_ms if idle_ms >= 0 else None)
        )
    return as_text(reply[0]), entries, int(reply[2])
