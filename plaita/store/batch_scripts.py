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
the caller could have had. Only calls on one server's client are merged (a cluster client never
reaches the loop connection, ``servable``), and only calls whose first key has the same hash tag
(``{p<i>}``: one partition, one slot, ``plaita.store.keyspace``) or none: a batch touches no slot
but one, unless each of its calls already touched several alone (the untagged keys of one
partition), which only a server out of cluster mode runs.

``KEYS`` is every call's keys in order; ``ARGV`` is the calls' key and argument counts (one
string, ``batch_command``), then every call's arguments in order. The reply is the array of the
calls' replies, in order (a ``nil`` reply travels as ``false``: the nil bulk it is alone, and no
hole that would cut the array short).

Only the scripts in ``BATCHED`` have twins: their bodies use no global but ``KEYS``, ``ARGV``
and Redis's libraries, define no global, and never reply ``nil``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import struct
from collections.abc import Sequence
from typing import Any

import hiredis
import redis

from plaita.store.calls import ScriptCall
from plaita.store.scripts import SCRIPTS, Script

#: The scripts the flow runner's loop connection sends many of at once (every step's write).
BATCHED = frozenset({"checkpoint_execution", "checkpoint_running", "create_execution"})

#: ARGV[1] holds each call's key count and argument count as two 16-bit big-endian numbers
#: (``string.byte``: no ``tonumber`` and its ``strtod`` per count). Each call's tables are made
#: at their size by ``unpack`` (filling them one by one regrows them, as Redis does for KEYS/ARGV).
#: A Lua error a call raised reaches its caller as alone: an error reply ``redis.call`` raised
#: keeps its code (``WRONGTYPE ...``, ``OOM ...``, ``READONLY ...``: in Redis 7.0 a ``pcall``
#: receives it as its text, not as the table a script's top level would), anything else is
#: ``ERR ...``. (A script's own ``error('CODE text')`` would keep CODE here and not alone: no
#: batched script raises one; and a batched call's error is never taken for a NOSCRIPT of the
#: whole call, ``LoopCalls`` resolves it as it is.)
_LOOP = """
local counts, out, byte, unpack = ARGV[1], {}, string.byte, unpack
local k, a = 0, 1
for i = 1, #counts / 4 do
  local k1, k2, a1, a2 = byte(counts, 4 * i - 3, 4 * i)
  local nk, na = k1 * 256 + k2, a1 * 256 + a2
  local ok, reply = pcall(one, {unpack(KEYS, k + 1, k + nk)}, {unpack(ARGV, a + 1, a + na)})
  k, a = k + nk, a + na
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

#: Keys or arguments a call may have to go in a batch; more go alone. ``unpack`` runs outside
#: the call's ``pcall`` and fails the whole batch past Lua's C stack (8000 values in Redis's Lua).
MAX_COUNT = 4000


@functools.cache
def batch_of(script: Script) -> Script | None:
    """``script``'s batch twin, or None when it has none (not in ``BATCHED``)."""
    if script.name not in BATCHED:
        return None
    text = f"local function one(KEYS, ARGV)\n{script.text.rstrip()}\nend\n{_LOOP}"
    return Script(f"{script.name}__batch-n.lua", text)


#: Every batch twin (loaded by the loop connection as it connects).
TWINS: tuple[Script, ...] = tuple(t for t in (batch_of(SCRIPTS[name]) for name in sorted(BATCHED)) if t is not None)


def load_twins(conn: Any) -> None:
    """Load every twin on ``conn`` (a connected redis-py connection); one the server refuses
    (an ACL without SCRIPT) is left to the NOSCRIPT path: its calls are sent again alone."""
    for twin in TWINS:
        conn.send_command("SCRIPT", "LOAD", twin.source)
        with contextlib.suppress(redis.ResponseError):
            conn.read_response()


def batch_command(batch: Script, calls: Sequence[ScriptCall]) -> tuple[Any, ...]:
    """The EVALSHA of ``batch`` (``batch_of`` the calls' script) running every one of ``calls``
    (each with at most ``MAX_COUNT`` keys and arguments)."""
    keys: list[Any] = []
    args: list[Any] = []
    counts: list[int] = []
    for call in calls:
        keys += call.keys
        args += call.args
        counts += (len(call.keys), len(call.args))
    return ("EVALSHA", batch.sha, len(keys), *keys, struct.pack(f">{len(counts)}H", *counts), *args)


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
    of one, alone as today. One execution's calls keep their order: a call joins a batch only
    if no call with its first key (the execution's lease key) stands between the batch's place
    and it outside that batch."""
    out: list[Entry] = []
    runs: dict[tuple[Script, Any], tuple[int, list[Waiting]]] = {}  # group: (its place in out, calls)
    last: dict[Any, tuple[int, Any]] = {}  # first key: (place in out of its last call, that batch or None)
    for waiting in queued:
        call = waiting[0]
        first = call.keys[0] if call.keys else None
        before = last.get(first)
        twin = batch_of(call.script)
        if twin is None or len(call.keys) > MAX_COUNT or len(call.args) > MAX_COUNT:
            last[first] = (len(out), None)
            out.append(waiting)
            continue
        group = (call.script, hash_tag(first))
        place, run = runs.get(group, (-1, None))
        if run is None or len(run) >= MAX_BATCH_CALLS or (before and before[0] > place and before[1] is not run):
            place, run = len(out), []
            runs[group] = (place, run)
            out.append(Batch(twin, run))
        run.append(waiting)
        last[first] = (place, run)
    return [e.items[0] if isinstance(e, Batch) and len(e.items) == 1 else e for e in out]


def hash_tag(key: Any) -> Any:
    """``key``'s hash tag as Redis Cluster reads it (what is between the first ``{`` and the
    next ``}``, if not empty), or None (also for a key that is no text: it goes in no batch of tagged keys)."""
    if isinstance(key, bytes):
        key = key.decode("latin-1")  # one character a byte: the same tag, as text
    elif not isinstance(key, str):
        return None
    start = key.find("{") + 1
    if not start:
        return None
    end = key.find("}", start)
    return key[start:end] if end > start else None


def packed(entry: Entry) -> bytes:
    """``entry``'s EVALSHA as written on the wire (raises what packing its arguments raises)."""
    if isinstance(entry, Batch):
        command = batch_command(entry.script, [call for call, _ in entry.items])
    else:
        call = entry[0]
        command = ("EVALSHA", call.script.sha, len(call.keys), *call.keys, *call.args)
    wire: bytes = hiredis.pack_command(command)
    return wire
