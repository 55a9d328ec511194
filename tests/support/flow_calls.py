"""Executions created under held leases and checkpoint calls to send, for tests of how script
calls travel (the loop connection, batch twins), on a real server."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import redis

from plaita.store.calls import ScriptCall
from plaita.store.executions.execution_io import checkpoint_call, create_now
from plaita.store.executions.store import ExecutionStore, Staged
from plaita.store.keyspace import DEFAULT, Keyspace
from plaita.store.leases import Lease, LeaseManager


def leased(client: redis.Redis, eids: list[str], ks: Keyspace = DEFAULT) -> dict[str, int]:
    """Each of ``eids`` leased (60 s): its generation."""
    leases = LeaseManager(client, consumer="flow-calls", ttl_s=60.0, keyspace=ks)
    out: dict[str, int] = {}
    for eid in eids:
        lease = leases.acquire(eid)
        assert isinstance(lease, Lease)
        out[eid] = lease.generation
    return out


def created(client: redis.Redis, eids: list[str], ks: Keyspace = DEFAULT) -> tuple[ExecutionStore, dict[str, int]]:
    """Each of ``eids`` leased and created (state ``{}``): the store and their generations."""
    store = ExecutionStore(client, ks)
    gens = leased(client, eids, ks)
    for eid, generation in gens.items():
        assert create_now(store, eid, generation, "{}", time.time(), None)[0] == 1
    return store, gens


def step(
    store: ExecutionStore, eid: str, generation: int, n: int, *, counter: str | None = None, running: bool = False
) -> ScriptCall:
    """A running checkpoint of state ``{"n": n}`` applying INCRBY 1 to ``counter`` (default
    ``app:<eid>``); ``running``: no staged write, through the short running script."""
    staged = [] if running else [Staged("incrby", counter or f"app:{eid}", "1")]
    return checkpoint_call(
        store.client,
        store.ks,
        eid,
        generation,
        json.dumps({"n": n}),
        status="running",
        now_s=time.time(),
        staged=staged,
        after_running=running,
    )


async def answer_bytewise(far: socket.socket, wanted_bytes: int, replies: bytes) -> bytes:
    """The far end of a socket pair played by hand: read the ``wanted_bytes`` the calls make,
    then answer ``replies`` one byte per write (a loop pass between bytes: one read each)."""
    loop = asyncio.get_running_loop()
    received = b""
    while len(received) < wanted_bytes:  # bounded by the bytes the calls make
        received += await loop.sock_recv(far, wanted_bytes - len(received))
    for i in range(len(replies)):
        await loop.sock_sendall(far, replies[i : i + 1])
        await asyncio.sleep(0)
    return received
