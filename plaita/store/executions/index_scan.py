"""Keyset scans of the status indexes: what ``FlowClient.list`` reads (``plaita.flows.producer.listing``).

Every tenant has one sorted set per status and partition (``Keyspace.status_key``: member the
execution id, score its last update). A scan walks any set of them newest first as one merged
order, ``(score, tenant, execution id)`` descending, and can start strictly after a ``Position``
(the last entry a previous page returned): a keyset cursor, so executions that start (or are
updated) meanwhile land before it and never shift what follows it, unlike an offset.

Nothing here is written: no index is added for the listing, and a scan never prunes one. Each
index is read in chunks of ``CHUNK`` entries (one ZREVRANGEBYSCORE each) and the documents of
the entries taken in pipelined GETs of at most ``CHUNK``; the caller bounds how many entries one
scan reads (``max_scanned``) and, when that bound stops it, gets the position to go on from.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from plaita.store.executions.execution_docs import UnreadableExecution, reply_text

#: Index entries one ZREVRANGEBYSCORE reads, and documents one pipeline reads.
CHUNK = 200


@dataclass(frozen=True, order=True)
class Position:
    """One index entry's place in the merged order (compared as a tuple, newest is largest)."""

    score: float
    tenant: str
    execution_id: str


@dataclass(frozen=True)
class Scan:
    """What one scan found: the documents it kept (with their entry's position and status),
    the unreadable keys it met, and where it stopped (None: nothing is left after its last row)."""

    rows: list[tuple[Position, str, dict[str, Any]]]
    unreadable: list[UnreadableExecution]
    next_after: Position | None
    #: Index entries read (each a document read too).
    scanned: int
    #: True when ``max_scanned`` stopped it before it found ``limit`` rows.
    capped: bool = field(default=False)


_Entry = tuple[Position, str, Any]  # (position, status, the tenant's ExecutionStore)


def _entries(
    store: Any, status: str, p: int, after: Position | None, min_score: float | None, first: list[Any]
) -> Iterator[_Entry]:
    """Entries of one index strictly after ``after``, newest first, a chunk per call (``first``:
    the reply of the first, read for every index in one pipeline). Redis orders equal scores by
    member, descending in a REV range: the tuple order of ``Position`` within one tenant (ids
    compare by code point, which is their UTF-8 byte order)."""
    key, tenant = store.ks.status_key(p, status), store.ks.tenant
    bound, offset, raw = after, 0, first
    while True:
        got = [Position(float(s), tenant, reply_text(m)) for m, s in raw]
        kept = [pos for pos in got if bound is None or pos < bound]
        for pos in kept:
            yield pos, status, store
        if len(got) < CHUNK:
            return
        # The next chunk starts at the last kept entry's score (entries at it already taken are
        # skipped); a whole chunk of ties at the bound is stepped over by offset.
        bound, offset = (kept[-1], 0) if kept else (bound, offset + CHUNK)
        raw = cast(list[Any], store.client.zrevrangebyscore(key, *_range(bound, min_score), offset, CHUNK, True))


def _range(bound: Position | None, min_score: float | None) -> tuple[str, str]:
    """(max, min) of a ZREVRANGEBYSCORE: from ``bound``'s score (inclusive: ties follow it) down."""
    return ("+inf" if bound is None else repr(bound.score)), ("-inf" if min_score is None else repr(min_score))


def _first_chunks(
    indexes: list[tuple[Any, str, int]], after: Position | None, min_score: float | None
) -> list[list[Any]]:
    """The first chunk of every index, in one pipeline per client (a page of a few dozen rows is
    then one round trip for the indexes, however many statuses, partitions and tenants)."""
    by_client: dict[int, list[int]] = {}
    for i, (store, _, _) in enumerate(indexes):
        by_client.setdefault(id(store.client), []).append(i)
    found: dict[int, list[Any]] = {}
    for members in by_client.values():
        pipe = indexes[members[0]][0].client.pipeline(transaction=False)
        for i in members:
            store, status, p = indexes[i]
            pipe.zrevrangebyscore(store.ks.status_key(p, status), *_range(after, min_score), 0, CHUNK, True)
        found.update(zip(members, pipe.execute(), strict=True))
    return [found[i] for i in range(len(indexes))]


def scan(
    stores: Sequence[Any],
    statuses: Sequence[str],
    *,
    after: Position | None,
    min_score: float | None,
    keep: Callable[[dict[str, Any]], bool],
    limit: int,
    max_scanned: int,
) -> Scan:
    """The newest ``limit`` documents after ``after`` of ``statuses`` in every one of ``stores``
    (``ExecutionStore`` of a tenant each) that ``keep`` accepts, reading at most ``max_scanned``
    index entries. A document whose status is no longer its entry's (it moved meanwhile; its new
    entry is elsewhere in the order) or that is gone (expired, its entry not trimmed yet) is
    skipped; ``min_score``: entries updated before it are not read at all."""
    indexes = [(store, status, p) for store in stores for status in statuses for p in range(len(store.ks.tags))]
    firsts = _first_chunks(indexes, after, min_score)
    sources = [_entries(*index, after, min_score, first) for index, first in zip(indexes, firsts, strict=True)]
    merged = heapq.merge(*sources, key=lambda e: e[0], reverse=True)
    rows: list[tuple[Position, str, dict[str, Any]]] = []
    bad: list[UnreadableExecution] = []
    scanned = 0
    last: Position | None = None
    while len(rows) < limit:
        budget = min(CHUNK, max_scanned - scanned, max(limit - len(rows), 1) if _all(keep) else CHUNK)
        batch = list(itertools.islice(merged, budget))
        if not batch:
            return Scan(rows, bad, None, scanned)
        for i, (entry, doc) in enumerate(zip(batch, _documents(batch), strict=True)):
            scanned += 1
            last = entry[0]
            if isinstance(doc, UnreadableExecution):
                bad.append(doc)
            elif isinstance(doc, dict) and doc.get("status") == entry[1] and keep(doc):
                rows.append((entry[0], entry[1], doc))
                if len(rows) == limit:  # a cursor only when some entry follows (None: the end)
                    more = i + 1 < len(batch) or next(merged, None) is not None
                    return Scan(rows, bad, last if more else None, scanned)
        if scanned >= max_scanned:
            return Scan(rows, bad, last, scanned, capped=True)
    return Scan(rows, bad, last, scanned)


def _documents(batch: list[_Entry]) -> list[dict[str, Any] | None | UnreadableExecution]:
    """Each entry's document, one pipelined read per tenant."""
    found: dict[int, dict[str, Any] | None | UnreadableExecution] = {}
    by_store: dict[int, list[int]] = {}
    for i, (_, _, store) in enumerate(batch):
        by_store.setdefault(id(store), []).append(i)
    for indexes in by_store.values():
        store = batch[indexes[0]][2]
        docs = store.read_many([batch[i][0].execution_id for i in indexes])
        found.update(zip(indexes, docs, strict=True))
    return [found[i] for i in range(len(batch))]


def keep_all(doc: dict[str, Any]) -> bool:
    """The ``keep`` of a scan without document filters."""
    return True


def _all(keep: Callable[[dict[str, Any]], bool]) -> bool:
    # Without filters every readable entry is a row: read no more documents than rows wanted.
    return keep is keep_all
