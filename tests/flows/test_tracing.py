"""OpenTelemetry spans of executions (``plaita.flows.tracing``), recorded by the SDK's in-memory
exporter: one trace per execution, from the producer's span through every task and step, on
whichever worker runs them. Each harness stands for a worker with a tracer provider of its own."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from plaita.errors import BadTaskError
from plaita.flows import tracing
from plaita.flows.tracing import parse_traceparent
from tests.flows import fanout_flows, flowdefs
from tests.flows.support import Harness, dlq, start
from tests.support.lease_workers import QUEUE

pytestmark = pytest.mark.redis

TID = "4bf92f3577b34da6a3ce929d0e0e4736"
TP = f"00-{TID}-00f067aa0ba902b7-01"


class Recorder:
    """A tracer provider of its own (one worker's, or the web app's) and what it exported."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider(shutdown_on_exit=False)
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("test")

    def spans(self, name: str | None = None) -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if name is None or s.name.startswith(name)]

    def one(self, name: str) -> ReadableSpan:
        (span,) = self.spans(name)
        return span


@pytest.fixture
def web() -> Iterator[Recorder]:
    r = Recorder()
    yield r
    r.provider.shutdown()


@pytest.fixture
def workers(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[Harness, Recorder]]]:
    """Two traced workers (A, B) over the test queue."""
    monkeypatch.setenv("PLAITA_TEST_REDIS_URL", redis_url)
    made = []
    for _ in range(2):
        rec = Recorder()
        made.append((Harness(redis_url, [*flowdefs.FLOWS, *fanout_flows.FLOWS], tracer_provider=rec.provider), rec))
    yield made
    for h, rec in made:
        h.close()
        rec.provider.shutdown()


def queued(h: Harness, stream: str = QUEUE) -> list[tuple[str, dict[str, Any]]]:
    """Every entry of a stream (the client's by default): (stream id, body)."""
    entries = h.client.xrange(stream)  # bytes replies: plaita's own client
    return [(mid.decode(), json.loads(f[b"payload"])) for mid, f in entries]  # type: ignore[union-attr]


def last_body(h: Harness) -> tuple[str, dict[str, Any]]:
    return queued(h)[-1]


def tp_of(span: ReadableSpan | trace.Span) -> str:
    sc = span.get_span_context()
    assert sc is not None
    return f"00-{sc.trace_id:032x}-{sc.span_id:016x}-{sc.trace_flags:02x}"


def parent_id(span: ReadableSpan) -> int | None:
    return None if span.parent is None else span.parent.span_id


def run_async(h: Harness, body: dict[str, Any], message_id: str) -> dict[str, Any] | None:
    """The task through ``run_async``, as the worker's async pool runs it (steps offloaded)."""
    task, lease = h.task(body, message_id)
    try:
        asyncio.run(h.runner.run_async(task))
    finally:
        h.leases.release(lease)
    return h.store.get(task.execution_id)


@pytest.mark.parametrize("mode", ["thread", "async"])
def test_three_steps_are_one_trace_under_the_web_request(
    workers: list[tuple[Harness, Recorder]], web: Recorder, mode: str
) -> None:
    (h, rec), _ = workers
    with web.tracer.start_as_current_span("POST /orders", kind=SpanKind.SERVER) as request:
        h.flows.start("ledger3", execution_id="t1")
    mid, body = last_body(h)
    assert body["traceparent"] == tp_of(request)
    doc = h.run(body, mid) if mode == "thread" else run_async(h, body, mid)
    assert doc is not None and doc["status"] == "completed"
    assert doc["traceparent"] == tp_of(request)  # the execution's origin
    task, steps = rec.one("plaita.task"), rec.spans("plaita.step ")
    assert [s.name for s in steps] == ["plaita.step one", "plaita.step two", "plaita.step three"]
    trace_id = request.get_span_context().trace_id
    assert {s.context.trace_id for s in [task, *steps]} == {trace_id}
    assert task.kind is SpanKind.CONSUMER and parent_id(task) == request.get_span_context().span_id
    assert all(parent_id(s) == task.context.span_id for s in steps)
    assert dict(task.attributes or {}) == {
        "messaging.system": "redis",
        "messaging.destination.name": h.store.ks.queue,
        "messaging.operation.type": "process",
        "messaging.message.id": mid,
        "plaita.execution_id": "t1",
        "plaita.task.type": "start",
        "plaita.delivery_count": 1,
        "plaita.flow": "ledger3",
        "plaita.outcome": "completed",
    }
    for s, name in zip(steps, ["one", "two", "three"], strict=True):
        assert dict(s.attributes or {}) == {
            "plaita.execution_id": "t1",
            "plaita.flow": "ledger3",
            "plaita.step": name,
            "plaita.attempt": 1,
            "plaita.outcome": "ok",
        }
        assert task.start_time <= s.start_time <= s.end_time <= task.end_time  # type: ignore[operator]


def test_a_resume_on_another_worker_joins_the_trace_and_links_its_producer(
    workers: list[tuple[Harness, Recorder]], web: Recorder
) -> None:
    (a, rec_a), (b, rec_b) = workers
    with web.tracer.start_as_current_span("POST /signup") as signup:
        a.flows.start("signup", execution_id="t2")
    assert a.run(*reversed(last_body(a)))["status"] == "suspended"  # type: ignore[index]
    with web.tracer.start_as_current_span("POST /email-confirmed") as confirmed:  # another request, its own trace
        b.flows.resume("t2", "event", "ann@example.org")
    doc = b.run(*reversed(last_body(b)))
    assert doc is not None and doc["status"] == "completed"
    first, resumed = rec_a.one("plaita.task"), rec_b.one("plaita.task")
    origin = signup.get_span_context()
    assert first.attributes["plaita.outcome"] == "suspended"  # type: ignore[index]
    assert [s.attributes["plaita.outcome"] for s in rec_a.spans("plaita.step ")] == ["ok", "suspended"]  # type: ignore[index]
    assert resumed.context.trace_id == origin.trace_id and parent_id(resumed) == origin.span_id
    assert resumed.attributes["plaita.resume_type"] == "event"  # type: ignore[index]
    (link,) = resumed.links
    assert (link.context.trace_id, link.context.span_id) == (
        confirmed.get_span_context().trace_id,
        confirmed.get_span_context().span_id,
    )
    assert [s.name for s in rec_b.spans("plaita.step ")] == ["plaita.step wait_email", "plaita.step finish"]
    assert all(s.context.trace_id == origin.trace_id for s in rec_b.spans())


def test_retries_are_failed_step_spans_and_a_later_retry_stays_in_the_trace(
    workers: list[tuple[Harness, Recorder]], web: Recorder
) -> None:
    (a, rec_a), (b, rec_b) = workers
    with web.tracer.start_as_current_span("POST /pay") as pay:
        a.flows.start("flaky", {"fail_times": 3}, execution_id="t3")
    assert a.run(*reversed(last_body(a)))["status"] == "error"  # type: ignore[index]
    attempts = rec_a.spans("plaita.step wobble")
    assert [(s.attributes["plaita.attempt"], s.attributes["plaita.outcome"]) for s in attempts] == [  # type: ignore[index]
        (1, "failed"),
        (2, "failed"),
        (3, "failed"),
    ]
    for s in attempts:
        assert s.status.status_code is StatusCode.ERROR
        assert [e.name for e in s.events] == ["exception"]
        assert s.events[0].attributes["exception.message"].startswith("flaky failure")  # type: ignore[index]
    assert rec_a.one("plaita.task").attributes["plaita.outcome"] == "error"  # type: ignore[index]
    b.flows.retry("t3", by="test")  # an operator's retry: no trace context of its own
    doc = b.run(*reversed(last_body(b)))
    assert doc is not None and doc["status"] == "completed"
    again = rec_b.one("plaita.task")
    assert again.context.trace_id == pay.get_span_context().trace_id and not again.links
    assert again.attributes["plaita.resume_type"] == "restart"  # type: ignore[index]
    (ok,) = rec_b.spans("plaita.step wobble")
    assert ok.attributes["plaita.outcome"] == "ok" and ok.status.status_code is StatusCode.UNSET  # type: ignore[index]


def test_an_execution_started_without_context_takes_its_first_task_as_origin(
    workers: list[tuple[Harness, Recorder]],
) -> None:
    (a, rec_a), (b, rec_b) = workers
    a.flows.start("signup", execution_id="t4")  # no current span: the body carries no traceparent
    mid, body = last_body(a)
    assert "traceparent" not in body
    doc = a.run(body, mid)
    first = rec_a.one("plaita.task")
    assert first.parent is None  # a root: the trace starts at the worker
    assert doc is not None and doc["traceparent"] == tp_of(first)
    b.flows.resume("t4", "event", "x")
    assert b.run(*reversed(last_body(b)))["status"] == "completed"  # type: ignore[index]
    later = rec_b.one("plaita.task")
    assert later.context.trace_id == first.context.trace_id and parent_id(later) == first.context.span_id


def test_children_join_the_trace_under_the_spawning_step(
    workers: list[tuple[Harness, Recorder]], web: Recorder
) -> None:
    (h, rec), _ = workers
    with web.tracer.start_as_current_span("POST /batch") as batch:
        h.flows.start("fan", {"n": 2}, execution_id="t5")
    ran: set[tuple[str, str]] = set()
    for _ in range(10):  # the parent's start, its children's starts, the join: bounded rounds
        # The client's start on its queue; what the runner enqueues (children, the join) on its store's.
        pending = [(q, mid, b) for q in (QUEUE, h.store.ks.queue) for mid, b in queued(h, q) if (q, mid) not in ran]
        if not pending:
            break
        for q, mid, body in pending:
            ran.add((q, mid))
            h.run(body, mid)
    assert h.store.get("t5")["status"] == "completed"  # type: ignore[index]
    spread = rec.spans("plaita.step spread")[0]  # its first run spawned the children
    tasks = rec.spans("plaita.task")
    kids = [t for t in tasks if t.attributes.get("plaita.flow") == "kid"]  # type: ignore[union-attr]
    assert len(kids) == 2 and all(parent_id(k) == spread.context.span_id for k in kids)
    assert {s.context.trace_id for s in rec.spans()} == {batch.get_span_context().trace_id}
    joined = [t for t in tasks if t.attributes.get("plaita.resume_type") == "child"]  # type: ignore[union-attr]
    assert len(joined) == 1 and parent_id(joined[0]) == batch.get_span_context().span_id


def test_the_producer_span_of_a_configured_client_parents_the_task(
    workers: list[tuple[Harness, Recorder]], web: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    (h, rec), _ = workers
    producer = Recorder()
    monkeypatch.setattr(tracing, "PRODUCERS", tracing.Tracing(producer.provider))  # the web app's SDK
    with producer.tracer.start_as_current_span("POST /orders") as request:
        h.flows.start("ledger3", execution_id="t6")
    enqueue = producer.one("plaita.enqueue")
    assert enqueue.kind is SpanKind.PRODUCER and parent_id(enqueue) == request.get_span_context().span_id
    assert enqueue.attributes["plaita.execution_id"] == "t6"  # type: ignore[index]
    assert enqueue.attributes["messaging.operation.type"] == "send"  # type: ignore[index]
    mid, body = last_body(h)
    assert body["traceparent"] == tp_of(enqueue)
    h.run(body, mid)
    assert parent_id(rec.one("plaita.task")) == enqueue.context.span_id
    producer.provider.shutdown()


BAD_TRACEPARENTS = [
    "garbage",
    42,
    {"traceparent": TP},
    f"00-{'0' * 32}-00f067aa0ba902b7-01",  # all-zero trace id
    f"00-{TID}-{'0' * 16}-01",  # all-zero span id
    f"ff-{TID}-00f067aa0ba902b7-01",  # the forbidden version
    TP.upper(),
    f"{TP}-more",  # version 00 has exactly four fields
    TP + "0" * 600,
    "",
]


@pytest.mark.parametrize("value", BAD_TRACEPARENTS)
def test_a_malformed_traceparent_is_ignored(workers: list[tuple[Harness, Recorder]], value: Any) -> None:
    (h, rec), _ = workers
    doc = h.run({**start("t7"), "traceparent": value})
    assert doc is not None and doc["status"] == "completed" and not dlq(h.client)
    task = rec.one("plaita.task")
    assert task.parent is None and not task.links
    assert doc["traceparent"] == tp_of(task)  # its own span became the origin


def test_parse_traceparent() -> None:
    assert parse_traceparent(TP) == TP
    assert parse_traceparent(f"01-{TID}-00f067aa0ba902b7-01-future") == TP  # a later version, read as 00
    assert parse_traceparent(f"00-{TID}-00f067aa0ba902b7-00") == f"00-{TID}-00f067aa0ba902b7-00"  # not sampled
    assert [parse_traceparent(v) for v in BAD_TRACEPARENTS] == [None] * len(BAD_TRACEPARENTS)


def test_without_configuration_nothing_is_traced_and_the_origin_is_kept(
    redis_url: str, web: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PLAITA_TEST_REDIS_URL", redis_url)
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)  # the suite sets no global one
    h = Harness(redis_url)  # no tracer_provider: the global one, which is the API's no-op proxy
    try:
        with web.tracer.start_as_current_span("POST /orders") as request:
            h.flows.start("signup", execution_id="t8")
        mid, body = last_body(h)
        assert body["traceparent"] == tp_of(request)  # the caller's context travels all the same
        doc = h.run(body, mid)
        assert doc is not None and doc["status"] == "suspended" and doc["traceparent"] == tp_of(request)
        h.flows.resume("t8", "event", "x")
        assert h.run(*reversed(last_body(h)))["status"] == "completed"  # type: ignore[index]
        untraced = h.run({**start("t9"), "traceparent": "garbage"})
        assert untraced is not None and untraced["status"] == "completed" and "traceparent" not in untraced
    finally:
        h.close()
    assert [s.name for s in web.spans()] == ["POST /orders"]  # the runner made none


def test_a_refused_task_ends_its_span_in_error(workers: list[tuple[Harness, Recorder]]) -> None:
    (h, rec), _ = workers
    task, lease = h.task({**start("t10", "no-such-flow"), "traceparent": TP})
    try:
        with pytest.raises(BadTaskError):
            h.runner(task)
    finally:
        h.leases.release(lease)
    span = rec.one("plaita.task")
    assert span.attributes["plaita.outcome"] == "refused"  # type: ignore[index]
    assert span.status.status_code is StatusCode.ERROR and [e.name for e in span.events] == ["exception"]
    assert f"{span.context.trace_id:032x}" == TID and "plaita.flow" not in span.attributes  # type: ignore[operator]


def test_a_tenants_task_names_its_tenant(workers: list[tuple[Harness, Recorder]]) -> None:
    (h, rec), _ = workers
    h.run({**start("t11"), "tenant_id": "acme", "traceparent": TP})
    task = rec.one("plaita.task")
    assert task.attributes["plaita.tenant_id"] == "acme"  # type: ignore[index]
    assert task.attributes["plaita.outcome"] == "completed"  # type: ignore[index]
