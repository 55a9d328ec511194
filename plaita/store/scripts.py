"""Lua scripts on the hot path, sent as a bare EVALSHA.

redis-py's ``Script`` objects make every pipeline that holds one send ``SCRIPT EXISTS`` first:
an extra round trip per read batch and per ack batch, most of a worker's cost with a fast
handler. Here a pipeline carries plain EVALSHAs; only when the server answers NOSCRIPT (it
restarted without its script cache) are the scripts loaded and the pipeline run once more.
Every pipeline built this way must therefore be safe to run twice: a NOSCRIPT reply means
the scripts did not run, and the plain commands beside them must be idempotent.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

import redis
from redis.client import Pipeline


class Lua:
    """One script: its source and SHA1."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode("utf-8")).hexdigest()

    def queue(self, pipe: Pipeline, keys: Sequence[Any], args: Sequence[Any]) -> None:
        """Queue this script on ``pipe`` (EVALSHA only)."""
        pipe.evalsha(self.sha, len(keys), *keys, *args)


def execute(
    client: redis.Redis, build: Callable[[Pipeline], None], scripts: Sequence[Lua], *, transaction: bool
) -> list[Any]:
    """Build a pipeline with ``build``, run it; on NOSCRIPT load ``scripts`` and run it again."""
    for attempt in (0, 1):
        pipe = client.pipeline(transaction=transaction)
        build(pipe)
        try:
            return pipe.execute()
        except redis.exceptions.NoScriptError:
            if attempt:
                raise
            for script in scripts:
                client.script_load(script.source)
    raise AssertionError("unreachable")  # pragma: no cover
