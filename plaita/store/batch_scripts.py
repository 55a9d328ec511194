"""Several calls of one script in one EVALSHA: the script's "batch" twin (``batch_of``).

An EVALSHA costs the server far more than the work of a short script: a checkpoint's ~130k
instructions hold ~47k that an empty script with its 27 arguments already costs (docs/benchmarks.md,
"Flow steps: the server side"). The flow runner's loop connection (``plaita.store.executions.loop_calls``)
writes many concurrent executions' calls at once; those of one script go out as one EVALSHA of
the script's twin, which runs the script's own body once per call.

The twin is the script's file wrapped as ``local function one(KEYS, ARGV) <file> end`` (its
includes assembled as for the script itself), then a loop calling ``one`` for each call with
that call's own KEYS and ARGV tables, under ``pcall``. So each call sees exactly what it would
alone (``#KEYS``, ``#ARGV``, an absent ARGV), a ``return`` ends that call only, and a call's
error becomes that call's own error reply inside the reply array while the calls after it still
run. Each call is atomic as before (the whole batch is, which a pipeline of single calls in one
server pass gives nothing between them either); a call that fails after a write keeps that write,
as the script alone would (Redis rolls back neither).

The calls merged are concurrent (none awaits another's reply), so any order among them is one
the caller could have had; only calls on one server's client are merged (a cluster client never
reaches the loop connection, ``servable``), where keys of different slots may share a script.

``KEYS`` is every call's keys in order; ``ARGV`` is the call count, then each call's key count
and argument count, then every call's arguments in order. The reply is the array of the calls'
replies, in order (a ``nil`` reply travels as ``false``: the nil bulk it is alone, and no hole
that would cut the array short).

Only the scripts in ``BATCHED`` have twins: their bodies use no global but ``KEYS``, ``ARGV``
and Redis's libraries, define no global, and never reply ``nil``.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Sequence
from typing import Any

import hiredis

from plaita.store.calls import ScriptCall
from plaita.store.scripts import Script

#: The scripts the flow runner's loop connection sends many of at once (every step's write).
BATCHED = frozenset({"checkpoint_execution", "checkpoint_running", "create_execution"})

#: A Lua error a call raised, as it would reach the caller alone: an error Redis returned to
#: ``redis.call`` keeps its code (``WRONGTYPE ...``, ``OOM ...``), anything else is ``ERR ...``.
_LOOP = """
local n = tonumber(ARGV[1])
local k, a, out = 0, 1 + 2 * n, {}
for i = 1, n do
  local nk, na = tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
  local keys, argv = {}, {}
  for j = 1, nk do keys[j] = KEYS[k + j] end
  for j = 1, na do argv[j] = ARGV[a + j] end
  k, a = k + nk, a + na
  local ok, reply = pcall(one, keys, argv)
  if not ok then
    if type(reply) == 'table' and reply.err then reply = reply.err end
    reply = tostring(reply)
    if not string.find(reply, '^%u[%u_-]* ') then reply = 'ERR ' .. reply end
    reply = {err = reply}
  elseif reply == nil then
    reply = false
  end
  out[i] = reply
end
return out
"""


@functools.cache
def batch_of(script: Script) -> Script | None:
    """``script``'s batch twin, or None when it has none (not in ``BATCHED``)."""
    if script.name not in BATCHED:
        return None
    text = f"local function one(KEYS, ARGV)\n{script.text.rstrip()}\nend\n{_LOOP}"
    return Script(f"{script.name}__batch-n.lua", text)


def batch_command(batch: Script, calls: Sequence[ScriptCall]) -> tuple[Any, ...]:
    """The EVALSHA of ``batch`` (``batch_of`` the calls' script) running every one of ``calls``."""
    keys: list[Any] = []
    header: list[Any] = [len(calls)]
    args: list[Any] = []
    for call in calls:
        keys += call.keys
        args += call.args
        header += (len(call.keys), len(call.args))
    return ("EVALSHA", batch.sha, len(keys), *keys, *header, *args)


#: A call on the loop connection and the future its reply (or error) goes to.
Waiting = tuple[ScriptCall, "asyncio.Future[Any]"]

#: Calls at most in one batch EVALSHA: bounds one reply (and a NOSCRIPT's re-sends), not the
#: server's time, which a pipeline of as many single calls would take as well.
MAX_BATCH_CALLS = 64


class Batch:
    """Calls of one script sent as one EVALSHA of its batch twin ``script``, answered by one array reply."""

    __slots__ = ("items", "script")

    def __init__(self, script: Script, items: list[Waiting]) -> None:
        self.script, self.items = script, items


#: What one reply answers: a call sent alone, or a batch.
Entry = Waiting | Batch


def entries(queued: list[Waiting]) -> list[Entry]:
    """``queued`` (one write's calls) as written: the calls of a script with a batch twin together
    (at most ``MAX_BATCH_CALLS`` a batch), where its first call was; any other call, or a batch
    of one, alone as today."""
    out: list[Entry] = []
    runs: dict[Script, list[Waiting]] = {}
    for waiting in queued:
        script = waiting[0].script
        run = runs.get(script)
        if run is None or len(run) >= MAX_BATCH_CALLS:
            twin = batch_of(script)
            if twin is None:
                out.append(waiting)
                continue
            run = runs[script] = []
            out.append(Batch(twin, run))
        run.append(waiting)
    return [e.items[0] if isinstance(e, Batch) and len(e.items) == 1 else e for e in out]


def packed(entry: Entry) -> bytes:
    """``entry``'s EVALSHA as written on the wire (raises what packing its arguments raises)."""
    if isinstance(entry, Batch):
        command = batch_command(entry.script, [call for call, _ in entry.items])
    else:
        call = entry[0]
        command = ("EVALSHA", call.script.sha, len(call.keys), *call.keys, *call.args)
    wire: bytes = hiredis.pack_command(command)
    return wire
