"""The write of a fork (``plaita.flows.fork``): a new execution, its index entry and its start.

One script (``record_fork``) so a fork is all there or not at all: a reader never sees the new
document without the start task that runs it, nor a start of a document that was not written.
"""

from __future__ import annotations

import json
from typing import Any, cast

from plaita.store import scripts
from plaita.store.executions.execution_docs import reply_text
from plaita.store.executions.staged import ExecutionKeyError
from plaita.store.executions.store import ExecutionStore
from plaita.store.keyspace import TENANTS_KEY
from plaita.tasks import PAYLOAD_FIELD, SCHEMA_FIELD, encode_body

RECORD_FORK = scripts.script("record_fork")


def record_fork(
    store: ExecutionStore,
    execution_id: str,
    doc_json: str,
    body: dict[str, Any],
    *,
    stream: str,
    now_s: float,
    events: dict[str, dict[str, Any]] | None = None,
) -> str | None:
    """Write ``doc_json`` (status running) as ``execution_id`` and add the start ``body`` to
    ``stream`` (the stream of its partition): the stream entry id, or None when the id is taken
    (nothing written); ``events`` (name: record) become its published events.
    ExecutionKeyError (nothing written) when a key holds the wrong type."""
    ks = store.ks
    if ks.tenant:  # the keeper and the listings must find the tenant of the new execution
        store.client.sadd(TENANTS_KEY, ks.tenant)
    keys = [ks.execution_key(execution_id), ks.status_key(ks.partition_of(execution_id), "running"), stream]
    keys.append(ks.events_key(execution_id))
    args = [execution_id, doc_json, repr(now_s), encode_body(body), "1", PAYLOAD_FIELD, SCHEMA_FIELD]
    for name, record in (events or {}).items():
        args += [name, json.dumps(record, ensure_ascii=False)]
    code, text = cast(list[Any], RECORD_FORK(store.client, keys, args))
    if int(code) == 4:
        raise ExecutionKeyError(reply_text(text), "holds the wrong type")
    return reply_text(text) if int(code) == 1 else None
