"""Flow hooks (``on_complete``, ``on_error``, ``on_end``) and several observers, on real Redis.

The promise pinned here: a hook runs once per execution that ended, after the checkpoint that
ended it, in the worker that wrote it; a redelivered task of an ended execution is a no-op and
runs no hook again (at most once: see docs/flows.md, "Hooks"); a hook that raises is logged and
fails nothing."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from plaita.errors import ConfigError
from plaita.flows import Flow, FlowRunner, NonRetryableError, StepContext
from plaita.flows.model.execution import Execution
from plaita.store.executions.store import ExecutionStore
from tests.flows.support import Harness, harness, resume, start

pytestmark = pytest.mark.redis


class Hooked:
    """A one-step flow (``params``: ``fail``, ``wait`` to suspend first) recording every hook call."""

    def __init__(self, *, raising: bool = False) -> None:
        self.calls: list[tuple[str, str, str]] = []
        self.seen: list[Execution] = []
        #: Set to read what the store holds while a hook runs.
        self.store: ExecutionStore | None = None
        self.stored: list[Any] = []
        self.flow = flow = Flow("hooked")

        @flow.step
        def only(ctx: StepContext) -> Any:
            if ctx.params.get("wait") and ctx.resume is None:
                return ctx.suspend()
            if ctx.params.get("fail"):
                raise NonRetryableError("refused")
            return {"done": True}

        @flow.on_complete
        def completed(ex: Execution) -> None:
            self.record("complete", ex)
            if raising:
                raise RuntimeError("a bug in the hook")

        @flow.on_error
        def failed(ex: Execution) -> None:
            self.record("error", ex)

        @flow.on_end
        async def ended(ex: Execution) -> None:  # async hooks run too
            self.record("end", ex)

    def record(self, kind: str, ex: Execution) -> None:
        self.calls.append((kind, ex.execution_id, ex.status))
        self.seen.append(ex)
        if self.store is not None:
            self.stored.append(self.store.get(ex.execution_id))


@pytest.fixture
def hooked(redis_url: str) -> Iterator[tuple[Harness, Hooked]]:
    flows = Hooked()
    with harness(redis_url) as h:
        h.runner.close()
        h.runner = FlowRunner([flows.flow], h.store)
        flows.store = h.store
        yield h, flows


def body(eid: str, **params: Any) -> dict[str, Any]:
    return start(eid, "hooked", **params)


def test_complete_fires_once_after_the_checkpoint_even_when_the_task_is_redelivered(
    hooked: tuple[Harness, Hooked],
) -> None:
    h, flows = hooked
    doc = h.run(body("c1"), message_id="7-0")
    assert doc is not None and doc["status"] == "completed"
    assert flows.calls == [("complete", "c1", "completed"), ("end", "c1", "completed")]
    ex = flows.seen[0]
    assert ex.results == {"only": {"done": True}} and ex.to_doc() == doc, "the hook sees what was checkpointed"
    assert flows.stored[0] == doc, "hooks run after the checkpoint is written"
    h.run(body("c1"), message_id="7-0")  # redelivered (its ack was lost): a no-op
    h.run(body("c1"))  # a duplicate start
    h.run(resume("c1", "event", "late"))  # a resume of an ended execution
    assert len(flows.calls) == 2


def test_error_fires_on_error_and_on_end_once(hooked: tuple[Harness, Hooked]) -> None:
    h, flows = hooked
    doc = h.run(body("f1", fail=True), message_id="8-0")
    assert doc is not None and doc["status"] == "error"
    assert flows.calls == [("error", "f1", "error"), ("end", "f1", "error")]
    h.run(body("f1", fail=True), message_id="8-0")
    assert len(flows.calls) == 2


def test_suspension_fires_nothing_and_a_cancel_fires_on_end_once(hooked: tuple[Harness, Hooked]) -> None:
    h, flows = hooked
    doc = h.run(body("s1", wait=True))
    assert doc is not None and doc["status"] == "suspended" and flows.calls == []
    cancel = resume("s1", "cancel", resume_id="k1")
    doc = h.run(cancel, message_id="9-0")
    assert doc is not None and doc["status"] == "cancelled"
    assert flows.calls == [("end", "s1", "cancelled")]
    h.run(cancel, message_id="9-0")
    assert len(flows.calls) == 1


def test_hooks_run_when_the_runner_runs_on_the_callers_loop(hooked: tuple[Harness, Hooked]) -> None:
    h, flows = hooked
    task, lease = h.task(body("a1"))
    try:
        asyncio.run(h.runner.run_async(task))
    finally:
        h.leases.release(lease)
    assert flows.calls == [("complete", "a1", "completed"), ("end", "a1", "completed")]


def test_a_hook_that_raises_is_logged_and_fails_nothing(redis_url: str, caplog: pytest.LogCaptureFixture) -> None:
    flows = Hooked(raising=True)
    with harness(redis_url) as h:
        h.runner.close()
        h.runner = FlowRunner([flows.flow], h.store)
        with caplog.at_level(logging.ERROR, logger="plaita.flows.runner.engine"):
            doc = h.run(body("r1"))  # raises nothing
    assert doc is not None and doc["status"] == "completed"
    assert flows.calls == [("complete", "r1", "completed"), ("end", "r1", "completed")], "later hooks still run"
    assert any("completed hook" in r.getMessage() and "raised; ignored" in r.getMessage() for r in caplog.records)


def test_a_hook_that_changes_the_execution_changes_nothing_stored(redis_url: str) -> None:
    flow = Flow("meddle")
    flow.step(name="only")(lambda ctx: {"n": 1})

    @flow.on_end
    def meddle(ex: Execution) -> None:
        with pytest.raises(AttributeError):
            ex.status = "running"  # type: ignore[misc]

    with harness(redis_url) as h:
        h.runner.close()
        h.runner = FlowRunner([flow], h.store)
        doc = h.run(start("m1", "meddle"))
    assert doc is not None and doc["status"] == "completed"


def test_a_hook_must_be_callable() -> None:
    with pytest.raises(ConfigError, match="callable"):
        Flow("x").on_end(None)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="one of"):
        Flow("x").add_hook("started", print)


class Events:
    def __init__(self, raising: bool = False) -> None:
        self.events: list[tuple[str, str]] = []
        self.raising = raising

    def execution_event(self, flow_id: str, event: str) -> None:
        self.events.append((flow_id, event))
        if self.raising:
            raise RuntimeError("observer bug")


def test_several_observers_each_hear_every_event_and_a_broken_one_fails_nothing(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PLAITA_TEST_REDIS_URL", redis_url)  # the ledger flow writes there
    broken, first, second = Events(raising=True), Events(), Events()
    with harness(redis_url, observer=broken) as h:
        h.runner.add_observer(first)
        h.runner.add_observer(second)
        doc = h.run(start("o1"))
    assert doc is not None and doc["status"] == "completed"
    assert first.events == second.events == broken.events == [("ledger3", "started"), ("ledger3", "completed")]
