"""``StoreIO``, the runner's door on Redis (``plaita.store.executions.execution_io``), on a real server: the
mode chosen once decides where every call runs, and the door's replies are the scripts' (a
fenced write refused, a completion refused for a cancel, an existing execution returned)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest
import redis

from plaita.store.executions.execution_io import StoreIO
from plaita.store.executions.store import ExecutionStore
from plaita.store.leases import Lease, LeaseManager
from plaita.tasks import Task

pytestmark = pytest.mark.redis

T = TypeVar("T")


def _here(coro: Coroutine[Any, Any, T]) -> T:
    """Drive a coroutine of the thread-mode door by hand, as ``FlowRunner.__call__`` does: it must
    finish without suspending (no event loop runs here)."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coro.close()
    raise AssertionError("the thread-mode door suspended")


def _task(client: redis.Redis, eid: str) -> Task:
    lease = LeaseManager(client, consumer="door", ttl_s=30.0).acquire(eid)
    assert isinstance(lease, Lease)
    task = Task("1-0", {"type": "start", "flow_id": "f", "execution_id": eid}, 1)
    task.fencing_token = lease.generation
    return task


class _ThreadOfReads(ExecutionStore):
    """A store whose ``get`` answers the thread it ran on: where the door runs a plain (not a
    script) call, such as a read, a flow slot or a registry read."""

    def get(self, execution_id: str) -> Any:
        return threading.get_ident()


def _doc(eid: str, status: str = "running") -> str:
    return json.dumps({"execution_id": eid, "status": status, "flow_id": "f"})


def test_the_thread_mode_door_runs_every_call_on_the_callers_thread(bclient: redis.Redis) -> None:
    io = StoreIO(_ThreadOfReads(bclient), here=True)
    task = _task(bclient, "t1")
    assert _here(io.create(task, _doc("t1"), time.time(), None))[0] == 1
    assert _here(
        io.checkpoint(task, _doc("t1"), status="running", now_s=time.time(), deadline_s=None, retention_s=0, staged=())
    ) == (True, False)
    assert _here(io.get(task, "any")) == threading.get_ident()
    assert io.create_ahead(task, _doc("t1"), time.time(), None) is None  # nothing is sent ahead here
    io.close()


def test_the_loop_mode_door_keeps_blocking_calls_off_the_loop(bclient: redis.Redis) -> None:
    io = StoreIO(_ThreadOfReads(bclient), here=False)
    task = _task(bclient, "t2")

    async def run() -> tuple[int, int, tuple[bool, bool]]:
        loop_thread = threading.get_ident()
        created = await io.create(task, _doc("t2"), time.time(), None)
        elsewhere = await io.get(task, "any")
        written = await io.checkpoint(
            task, _doc("t2"), status="running", now_s=time.time(), deadline_s=None, retention_s=0, staged=()
        )
        assert elsewhere != loop_thread
        return created[0], elsewhere, written

    try:
        code, _, written = asyncio.run(run())
    finally:
        io.close()
    assert code == 1 and written == (True, False)


def test_a_stale_generation_is_refused_and_a_cancel_refuses_a_completion(bclient: redis.Redis) -> None:
    store = ExecutionStore(bclient)
    io = StoreIO(store, here=True)
    task = _task(bclient, "t3")
    assert _here(io.create(task, _doc("t3"), time.time(), None))[0] == 1
    store.request_cancel("t3")
    assert _here(
        io.checkpoint(
            task,
            _doc("t3", "completed"),
            status="completed",
            now_s=time.time(),
            deadline_s=None,
            retention_s=0,
            staged=(),
        )
    ) == (False, True)
    assert _here(io.cancel_requested(task)) is True
    stale = Task("2-0", task.body, 1)
    stale.fencing_token = task.fencing_token - 1
    assert (
        _here(
            io.checkpoint(
                stale, _doc("t3"), status="running", now_s=time.time(), deadline_s=None, retention_s=0, staged=()
            )
        )[0]
        is False
    )
    io.close()


def test_a_second_create_returns_the_existing_document(bclient: redis.Redis) -> None:
    io = StoreIO(ExecutionStore(bclient), here=True)
    task = _task(bclient, "t4")
    assert _here(io.create(task, _doc("t4"), time.time(), None))[0] == 1
    code, text, _ = _here(io.create(task, _doc("t4"), time.time(), None))
    assert code == 3 and io.parse(task, text) == json.loads(_doc("t4"))
    io.close()
