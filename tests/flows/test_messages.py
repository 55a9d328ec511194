"""Messages to a running execution (issue 33 item 1): ``FlowClient.send(id, topic, data)`` and
``ctx.recv(topic, timeout_s=...)``. A recv is a suspension waiting for its topic and a message an
event addressed to it (``plaita.flows.model.inbox``), so what those guarantee holds here: each
test says which part of the promise it guards. The tests with a ``Harness`` deliver exactly the
tasks ``send`` put on the stream, in stream order, to a runner on a real server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from plaita.errors import NotForThisWorker
from plaita.flows.producer.client import ExecutionNotFound, FlowClient, NotResumable
from tests.flows import msgdefs
from tests.flows.support import Harness, harness, resume, start
from tests.flows.test_cli import plaita
from tests.support.lease_workers import FAST_RECLAIM_ARGS, QUEUE, wait_for, worker_proc
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.redis

WORKER_ARGS = ("--flows", "tests.flows.msgdefs", *FAST_RECLAIM_ARGS)


@pytest.fixture
def h(redis_url: str) -> Iterator[Harness]:
    with harness(redis_url, flows=msgdefs.FLOWS) as opened:
        yield opened


def _send(h: Harness, seen: list[str], eid: str, data: Any, key: str | None = None) -> dict[str, Any] | None:
    h.flows.send(eid, "t", data, idempotency_key=key)
    return h.deliver(seen)


def test_three_messages_sent_while_it_waits_arrive_in_order(h: Harness) -> None:
    seen: list[str] = []
    assert h.run(start("m1", "msg-inbox"))["suspension"]["wait_for"] == "t"  # type: ignore[index]
    doc = _send(h, seen, "m1", {"n": 1})
    assert doc is not None and doc["status"] == "suspended" and doc["state"]["got"] == [{"n": 1}]
    _send(h, seen, "m1", {"n": 2})
    doc = _send(h, seen, "m1", {"n": 3})
    assert doc is not None and doc["status"] == "completed"
    assert doc["results"]["collect"] == {"got": [{"n": 1}, {"n": 2}, {"n": 3}]}


def test_messages_sent_before_the_recv_are_kept_and_taken_oldest_first(h: Harness) -> None:
    """A message that comes while the execution is elsewhere (here: waiting for ``go``) is kept
    in its inbox, in the order sent; each recv then takes the oldest at once, without suspending."""
    seen: list[str] = []
    h.run(start("m2", "msg-inbox", gate=True))
    for n in (1, 2, 3):
        doc = _send(h, seen, "m2", n)
    assert doc is not None and doc["suspension"]["wait_for"] == "go"
    assert [(e["wait_for"], e["data"]) for e in doc["inbox"]] == [("t", 1), ("t", 2), ("t", 3)]
    doc = h.run(resume("m2", "event", "open", wait_for="go", resume_id="go-1"))
    assert doc is not None and doc["status"] == "completed" and "inbox" not in doc
    assert doc["results"]["collect"] == {"got": [1, 2, 3]}
    took = [e["resume_id"] for e in doc["history"] if e["outcome"] == "resumed" and e.get("wait_for") == "t"]
    assert took == [e for e in took if e in seen] and len(took) == 3  # each by the task that sent it


def test_a_recv_that_times_out_returns_none(h: Harness) -> None:
    doc = h.run(start("m3", "msg-inbox", timeout_s=60))
    assert doc is not None and h.client.zscore("plaita:executions:deadlines", "m3") is not None
    doc = h.run(resume("m3", "timeout", suspension=doc["suspension"]["seq"]))  # what the keeper sends
    assert doc is not None and doc["status"] == "completed" and doc["results"]["collect"] == {"got": [None]}


def test_an_idempotency_key_makes_a_repeated_send_a_no_op(h: Harness) -> None:
    seen: list[str] = []
    h.run(start("m4", "msg-inbox", gate=True))
    _send(h, seen, "m4", "x", key="k1")
    doc = _send(h, seen, "m4", "x again", key="k1")  # the caller's retry: received already
    assert doc is not None and [e["data"] for e in doc["inbox"]] == ["x"]
    h.run(resume("m4", "event", None, wait_for="go", resume_id="go-4"))
    doc = _send(h, seen, "m4", "y", key="k2")
    assert doc is not None and doc["state"]["got"] == ["x", "y"]
    doc = _send(h, seen, "m4", "y again", key="k2")  # after it was taken, too
    assert doc is not None and doc["state"]["got"] == ["x", "y"] and doc["status"] == "suspended"
    assert _send(h, seen, "m4", "z", key="k3")["results"]["collect"] == {"got": ["x", "y", "z"]}  # type: ignore[index]


def test_a_send_to_an_ended_or_unknown_execution_is_refused(h: Harness) -> None:
    seen: list[str] = []
    h.run(start("m5", "msg-inbox"))
    for n in (1, 2, 3):
        doc = _send(h, seen, "m5", n)
    assert doc is not None and doc["status"] == "completed"
    with pytest.raises(NotResumable, match="completed"):
        h.flows.send("m5", "t", 4)
    with pytest.raises(ExecutionNotFound):
        h.flows.send("no-such-execution", "t", 1)
    for bad in ("", None, "x" * 201):
        with pytest.raises(ValueError, match="topic"):
            h.flows.send("m5", bad, 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="idempotency_key"):
        h.flows.send("m5", "t", 1, idempotency_key="")
    assert h.deliver(seen) is None  # nothing was enqueued by the refused sends


def test_a_send_reaches_only_its_tenants_execution(h: Harness) -> None:
    seen: list[str] = []
    h.run({**start("m6", "msg-inbox"), "tenant_id": "acme"})
    with pytest.raises(ExecutionNotFound):
        h.flows.send("m6", "t", 1)  # the default tenant has no m6
    acme = h.flows.for_tenant("acme")
    for n in (1, 2, 3):
        acme.send("m6", "t", n)
        doc = h.deliver(seen)
    assert doc is not None and doc["results"]["collect"] == {"got": [1, 2, 3]}
    assert acme.get("m6")["status"] == "completed"  # type: ignore[index]


def test_the_cli_sends_a_message(redis_url: str, h: Harness) -> None:
    seen: list[str] = []
    h.run(start("m7", "msg-inbox", gate=True))
    args = ("executions", "send", "m7", "t", "--data", '{"a": 1}', "--idempotency-key", "k")
    for _ in range(2):
        r = plaita(redis_url, *args)
        assert r.returncode == 0, r.stderr
    doc = h.deliver(seen)
    assert doc is not None and [e["data"] for e in doc["inbox"]] == [{"a": 1}]
    r = plaita(redis_url, "executions", "send", "nope", "t", "--data", "1")
    assert r.returncode == 1 and "no execution 'nope'" in r.stderr and "Traceback" not in r.stderr
    r = plaita(redis_url, "executions", "send", "m7", "t", "--data", "{not json")
    assert r.returncode == 2 and "--data is not valid JSON" in r.stderr and "Traceback" not in r.stderr
    r = plaita(redis_url, "executions", "send", "m7", "", "--data", "1")
    assert r.returncode == 2 and "topic" in r.stderr and "Traceback" not in r.stderr


def test_a_message_sent_before_the_start_ran_is_kept_until_it_has(h: Harness) -> None:
    """Queued: no worker created the execution yet. A message is accepted all the same; a worker
    that reads it before the start hands it back (no delivery charged), and once the start ran it
    waits in the inbox for its recv. A resume addressed to no wait is still refused: nothing could
    take it."""
    eid = h.flows.start("msg-inbox", {})
    h.flows.send(eid, "t", 1)
    with pytest.raises(ExecutionNotFound, match="queued: its start has not run"):
        h.flows.resume(eid, "event", 1)
    (start_id, start_fields), (msg_id, msg_fields) = h.client.xrange(h.queue.stream)
    with pytest.raises(NotForThisWorker, match="whose start has not run") as handed:
        h.run(json.loads(msg_fields[b"payload"]), message_id=msg_id.decode())  # read first: handed back
    assert handed.value.hand_back and handed.value.delay_s > 0
    h.run(json.loads(start_fields[b"payload"]), message_id=start_id.decode())
    doc = h.run(json.loads(msg_fields[b"payload"]), message_id=msg_id.decode())  # read again after its delay
    assert doc is not None and doc["state"]["got"] == [1], doc


def test_kill9_while_waiting_in_recv_the_message_still_arrives(
    redis_url: str, flows: FlowClient, tmp_path: Path
) -> None:
    """The recv is a suspension: no thread or lease holds it, so a worker killed while the
    execution waits loses nothing; a message sent while no worker runs waits in the stream."""
    eid = flows.start("msg-inbox", {})
    with worker_proc(redis_url, tmp_path, "ma", *WORKER_ARGS) as a:
        wait_for(lambda: (flows.get(eid) or {}).get("status") == "suspended", 15, "the recv waiting")
        flows.send(eid, "t", 1)
        wait_for(lambda: (flows.get(eid) or {}).get("state", {}).get("got") == [1], 15, "the first message")
        wait_for(lambda: (flows.get(eid) or {}).get("status") == "suspended", 15, "the second recv waiting")
        a.kill9()
    flows.send(eid, "t", 2)  # no worker runs now
    flows.send(eid, "t", 3, idempotency_key="three")
    with worker_proc(redis_url, tmp_path, "mb", *WORKER_ARGS) as b:
        doc = flows.wait(eid, 30)
        assert b.terminate() == 0
    assert doc["status"] == "completed" and doc["results"]["collect"] == {"got": [1, 2, 3]}


def test_a_recv_survives_a_redis_restart(
    private_redis: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kill -9 of the server (AOF, fsync always) while the recv waits: the wait is the
    execution's document, so the message sent once the server is back still arrives."""
    monkeypatch.setenv("PLAITA_TEST_REDIS_URL", private_redis.url)
    with FlowClient.from_url(private_redis.url, queue_name=QUEUE) as before:
        eid = before.start("msg-inbox", {})
        with worker_proc(private_redis.url, tmp_path, "mr", *WORKER_ARGS) as w:
            wait_for(lambda: (before.get(eid) or {}).get("status") == "suspended", 15, "the recv waiting")
            private_redis.restart()
            with FlowClient.from_url(private_redis.url, queue_name=QUEUE) as flows:
                assert (flows.get(eid) or {}).get("status") == "suspended"
                for n in (1, 2, 3):
                    flows.send(eid, "t", n)
                    got = list(range(1, n + 1))
                    wait_for(lambda: (flows.get(eid) or {}).get("state", {}).get("got") == got, 60, f"message {n}")  # noqa: B023
                doc = flows.wait(eid, 30)
            assert w.terminate() == 0
    assert doc["status"] == "completed" and doc["results"]["collect"] == {"got": [1, 2, 3]}


def test_a_recv_times_out_to_none_with_a_keeper(redis_url: str, flows: FlowClient, tmp_path: Path) -> None:
    eid = flows.start("msg-inbox", {"timeout_s": 0.5})
    with worker_proc(redis_url, tmp_path, "mk", *WORKER_ARGS, "--keeper") as w:
        doc = flows.wait(eid, 30)
        assert w.terminate() == 0
    assert doc["status"] == "completed" and doc["results"]["collect"] == {"got": [None]}


# -- ctx.recv itself (no server) ----------------------------------------------------------------


def test_a_recv_in_a_process_pool_child_waits_the_same(redis_url: str, flows: FlowClient, tmp_path: Path) -> None:
    """``Receiving`` is raised in the child and comes back over its pipe (pickled)."""
    eid = flows.start("msg-inbox", {})
    with worker_proc(redis_url, tmp_path, "mp", *WORKER_ARGS, "--pool", "process", "--concurrency", "1") as w:
        wait_for(lambda: (flows.get(eid) or {}).get("status") == "suspended", 30, "the recv waiting")
        for n in (1, 2, 3):  # each after the last was taken: the order that holds (docs/flows.md, Messages)
            flows.send(eid, "t", n)
            got = list(range(1, n + 1))
            wait_for(lambda: (flows.get(eid) or {}).get("state", {}).get("got") == got, 30, f"message {n}")  # noqa: B023
        doc = flows.wait(eid, 30)
        assert w.terminate() == 0
    assert doc["status"] == "completed" and doc["results"]["collect"] == {"got": [1, 2, 3]}


@pytest.mark.parametrize("pool", ["thread", "process"])
def test_state_written_before_a_recv_is_kept_by_its_wait(
    redis_url: str, flows: FlowClient, tmp_path: Path, pool: str
) -> None:
    """As for ``suspend``: what the step left in ``ctx.state`` before its recv is checkpointed with
    the wait, so the run after the message sees it (in a pool child too, where the state must
    travel back with ``Receiving``'s suspension)."""
    eid = flows.start("msg-state", {})
    with worker_proc(redis_url, tmp_path, f"ms-{pool}", *WORKER_ARGS, "--pool", pool, "--concurrency", "1") as w:
        wait_for(lambda: (flows.get(eid) or {}).get("status") == "suspended", 30, "the recv waiting")
        assert (flows.get(eid) or {})["state"] == {"runs": 1}
        flows.send(eid, "t", "hello")
        doc = flows.wait(eid, 30)
        assert w.terminate() == 0
    assert doc["status"] == "completed" and doc["results"]["count_then_recv"] == {"runs": 2, "msg": "hello"}
