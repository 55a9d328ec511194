"""Script calls as values: built without I/O, sent alone (``ScriptCall.run``) or many in one
pipelined round trip (``run_calls``: the flow runner's checkpoints and creates of concurrent
executions, ``CallBatcher`` in ``plaita.store.executions.execution_io``).

A batch is a plain pipeline, not a transaction: each call is one EVALSHA, atomic on its own,
and each gets its own reply or error, as if sent alone. On NOSCRIPT only the calls Redis
refused are sent again (once their script is loaded): the others already ran, and running a
checkpoint twice would apply its staged INCRBY twice.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from plaita.store.scripts import Script


@dataclass(frozen=True)
class ScriptCall:
    """One EVALSHA of ``script`` on ``client`` and how to read its reply (``parse`` may raise:
    the refusal the reply names)."""

    client: redis.Redis
    script: Script
    keys: Sequence[Any]
    args: Sequence[Any]
    parse: Callable[[Any], Any]

    def run(self) -> Any:
        """Send it now (loading the script on NOSCRIPT); its parsed reply."""
        return self.parse(self.script(self.client, self.keys, self.args))


def batchable(client: Any) -> bool:
    """True when calls on ``client`` may share a pipeline: a single server's client. A cluster
    client's pipeline would split them by slot; its calls are sent one by one instead."""
    return type(client) is redis.Redis


def run_calls(client: redis.Redis, calls: Sequence[ScriptCall]) -> list[Any]:
    """Send ``calls`` (all on ``client``) in one pipeline; each one's parsed reply, or the
    exception it ended in, in order. A connection error fails every call of the batch (the
    same exception for each: whether those sent ran is unknown, as for a single call)."""
    if len(calls) == 1:
        return [_settled(calls[0].run)]
    pipe = client.pipeline(transaction=False)
    for call in calls:
        call.script.queue(pipe, call.keys, call.args)
    try:
        replies = pipe.execute(raise_on_error=False)
    except redis.RedisError as exc:
        return [exc] * len(calls)
    out: list[Any] = []
    for call, reply in zip(calls, replies, strict=True):
        if isinstance(reply, redis.exceptions.NoScriptError):
            out.append(_settled(call.run))  # it did not run: send it again, loading its script
        elif isinstance(reply, Exception):
            out.append(reply)
        else:
            out.append(_settled(lambda c=call, r=reply: c.parse(r)))  # type: ignore[misc]
    return out


def _settled(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception as exc:  # returned in the call's place: it is that call's outcome
        return exc
