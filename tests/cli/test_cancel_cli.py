"""Issue 29, items 4 and 5 as an operator meets them: ``plaita executions cancel`` of a start
waiting for a ``max_concurrent`` slot (it answered "no execution", exit 1, and the execution then
ran), of a running last step (it ended ``completed``), and what it says and exits with in every
case. A real worker process, a real private redis-server; steps hold until released or cancelled."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from plaita.flows.producer.client import FlowClient
from tests.flows import cancel_flows, flowdefs
from tests.flows.support import ledgers
from tests.flows.test_cli import plaita
from tests.support.lease_workers import QUEUE, wait_for, worker_proc

pytestmark = pytest.mark.redis

WORKER_ARGS = ("--flows", "tests.flows.cancel_flows", "--read-block-ms", "200", "--concurrency", "2")
#: The bound of every wait here (the worker's lease TTL is 10 s: a cancel lands well within it).
WAIT_S = 20.0


@pytest.fixture
def flows(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[FlowClient]:
    monkeypatch.setenv("PLAITA_TEST_REDIS_URL", redis_url)
    with FlowClient.from_url(redis_url, queue_name=QUEUE, socket_timeout_s=5.0) as client:
        yield client


def test_cancel_of_a_start_waiting_for_a_slot_and_of_a_running_last_step(
    redis_url: str, flows: FlowClient, tmp_path: Path
) -> None:
    with worker_proc(redis_url, tmp_path, "cancel-cli", *WORKER_ARGS) as w:
        w.wait_reading()
        flows.start("gated", {}, execution_id="g-hold")  # takes the flow's one slot, holds it
        wait_for(lambda: ledgers("g-hold", ["occupy"]) == [1], WAIT_S, "g-hold in its step")
        flows.start("gated", {}, execution_id="g-wait")  # waits for the slot: no execution yet
        r = plaita(redis_url, "executions", "cancel", "g-wait")
        assert r.returncode == 0, r.stderr
        # The worker may read the start put back and end it before the cancel looks again (CI saw it).
        assert any(
            said in r.stdout
            for said in ("queued and will end cancelled when a worker reads it", "g-wait ended cancelled")
        ), r.stdout
        assert flows.wait("g-wait", WAIT_S)["status"] == "cancelled"  # without the slot:
        assert flows.get("g-hold")["status"] == "running"  # type: ignore[index]
        assert ledgers("g-wait", ["occupy"]) == [0]

        r = plaita(redis_url, "executions", "cancel", "g-hold", "--wait", "--timeout-s", str(WAIT_S))
        assert r.returncode == 0, r.stderr
        assert any(
            said in r.stdout for said in ("is running: it ends cancelled at its next", "g-hold ended cancelled")
        ), r.stdout
        assert "execution g-hold cancelled" in r.stdout, r.stdout
        assert ledgers("g-hold", ["occupy"], "staged") == [0]  # its last step's writes discarded

        r = plaita(redis_url, "executions", "cancel", "g-hold")
        assert (r.returncode, r.stdout.strip()) == (0, "execution g-hold already cancelled"), r.stderr

        flowdefs.client().set(cancel_flows.release_key("done"), "1")
        flows.start("last", {}, execution_id="done")
        assert flows.wait("done", WAIT_S)["status"] == "completed"
        r = plaita(redis_url, "executions", "cancel", "done")
        assert r.returncode == 3 and "already completed; nothing to cancel" in r.stdout, (r.stdout, r.stderr)
        assert w.terminate() == 0


def test_cancel_of_an_unknown_id_is_exit_1_with_one_line_and_writes_nothing(redis_url: str, flows: FlowClient) -> None:
    r = plaita(redis_url, "executions", "cancel", "ghost")
    assert r.returncode == 1, r.stdout
    assert r.stderr.strip().splitlines() == ["plaita executions cancel: no execution 'ghost' and no start of it queued"]
    assert flowdefs.client().exists(flows.store.ks.cancel_key("ghost")) == 0
