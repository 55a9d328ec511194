"""Tracing as a user runs it: ``plaita worker --otel console``, ``plaita enqueue`` with
``$TRACEPARENT``, bad ``--otel`` flags, and plaita with OpenTelemetry not installed at all."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.flows import flowdefs
from tests.flows.test_workers import FLOW_ARGS
from tests.support.lease_workers import QUEUE, ROOT, wait_for, worker_env, worker_proc

pytestmark = pytest.mark.redis

TID = "4bf92f3577b34da6a3ce929d0e0e4736"
SCRIPT_SPAN = "00f067aa0ba902b7"


@pytest.fixture(autouse=True)
def _test_redis(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLAITA_TEST_REDIS_URL", redis_url)  # flowdefs.client(): the test's server


def enqueue(url: str, body: dict[str, Any], *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "plaita", "enqueue", "--redis-url", url, "--queue-name", QUEUE, *args]
    cmd.append(json.dumps(body))
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=30)


def console_spans(text: str) -> list[dict[str, Any]]:
    """The span objects the console exporter wrote (indented JSON, each opening on a line ``{``)."""
    decoder, spans, at = json.JSONDecoder(), [], 0
    while (at := text.find("\n{\n", at)) != -1:
        span, end = decoder.raw_decode(text, at + 1)
        spans.append(span)
        at = end
    return spans


def test_worker_and_enqueue_export_one_trace_to_the_console(redis_url: str, tmp_path: Path) -> None:
    env = {**worker_env(redis_url), "TRACEPARENT": f"00-{TID}-{SCRIPT_SPAN}-01"}
    with worker_proc(redis_url, tmp_path, "otel-w", *FLOW_ARGS, "--otel", "console") as w:
        w.wait_reading()
        body = {"type": "start", "flow_id": "ledger3", "execution_id": "o1"}
        r = enqueue(redis_url, body, "--otel", "console", env=env)
        assert r.returncode == 0, r.stderr
        assert len(r.stdout.split()) == 1  # stdout keeps the message id alone: spans go to stderr
        wait_for(lambda: flowdefs.client().zscore("plaita:executions:status:completed", "o1") is not None, 10, "o1")
        assert w.terminate() == 0  # the SDK flushes its buffered spans at exit
        worker_spans = console_spans("\n" + w.stderr())
    (producer,) = console_spans("\n" + r.stderr)
    assert producer["name"] == "plaita.enqueue" and producer["kind"] == "SpanKind.PRODUCER"
    assert producer["context"]["trace_id"] == f"0x{TID}" and producer["parent_id"] == f"0x{SCRIPT_SPAN}"
    assert producer["resource"]["attributes"]["service.name"] == "plaita-enqueue"
    by_name = {s["name"]: s for s in worker_spans}
    assert sorted(by_name) == ["plaita.step one", "plaita.step three", "plaita.step two", "plaita.task"]
    task = by_name["plaita.task"]
    assert task["kind"] == "SpanKind.CONSUMER" and task["parent_id"] == producer["context"]["span_id"]
    assert task["attributes"]["plaita.outcome"] == "completed"
    assert task["resource"]["attributes"]["service.name"] == "plaita-worker"
    assert {s["context"]["trace_id"] for s in worker_spans} == {f"0x{TID}"}
    assert all(by_name[f"plaita.step {n}"]["parent_id"] == task["context"]["span_id"] for n in ("one", "two", "three"))


def test_enqueue_carries_traceparent_without_otel_flag(redis_url: str) -> None:
    env = {**worker_env(redis_url), "TRACEPARENT": f"00-{TID}-{SCRIPT_SPAN}-01"}
    r = enqueue(redis_url, {"type": "start", "flow_id": "ledger3", "execution_id": "o2"}, env=env)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    env["TRACEPARENT"] = "not-a-traceparent"  # ignored, as a worker ignores one in a body
    mine = f"00-{'1' * 32}-{'2' * 16}-01"
    r = enqueue(redis_url, {"type": "start", "flow_id": "ledger3", "traceparent": mine}, env=env)
    assert r.returncode == 0, r.stderr
    bodies = [json.loads(f["payload"]) for _, f in flowdefs.client().xrange(QUEUE)]
    assert [b.get("traceparent") for b in bodies] == [f"00-{TID}-{SCRIPT_SPAN}-01", mine]


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("bogus", "--otel 'bogus': expected one of off, console, otlp"),
        pytest.param(
            "otlp",
            "needs the OTLP exporter: pip install opentelemetry-exporter-otlp",
            marks=pytest.mark.skipif(
                importlib.util.find_spec("opentelemetry.exporter") is not None, reason="an OTLP exporter is installed"
            ),
        ),
    ],
)
def test_a_bad_otel_flag_exits_2(redis_url: str, flag: str, message: str) -> None:
    env = {**worker_env(redis_url), "PLAITA_OTEL": flag}
    r = enqueue(redis_url, {"type": "start", "flow_id": "ledger3"}, env=env)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert flowdefs.client().xlen(QUEUE) == 0


PUBLIC_API = """
import sys

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)  # the program's own SDK setup, before the worker starts

from plaita import Flow, FlowClient, Settings, start_worker

flow = Flow("traced")

@flow.step
def charge(ctx):
    with trace.get_tracer("app").start_as_current_span("POST gateway/charge"):
        return {"charged": True}

@flow.step
async def mail(ctx):
    return {"mailed": True}

url, queue = sys.argv[1], sys.argv[2]
with start_worker(Settings(redis_url=url, queue_name=queue, consumer_name="traced-c"), flows=[flow]):
    with FlowClient.from_url(url, queue_name=queue) as client:
        with trace.get_tracer("web").start_as_current_span("POST /orders") as request:
            eid = client.start("traced")
        assert client.wait(eid, timeout_s=20)["status"] == "completed"
spans = {s.name: s for s in exporter.get_finished_spans()}
assert sorted(spans) == [
    "POST /orders", "POST gateway/charge", "plaita.enqueue", "plaita.step charge", "plaita.step mail", "plaita.task"
], sorted(spans)
assert {s.context.trace_id for s in spans.values()} == {request.get_span_context().trace_id}
def parent(name):
    return spans[name].parent.span_id
assert parent("plaita.enqueue") == request.get_span_context().span_id
assert parent("plaita.task") == spans["plaita.enqueue"].context.span_id
assert parent("plaita.step mail") == spans["plaita.task"].context.span_id
assert parent("POST gateway/charge") == spans["plaita.step charge"].context.span_id
print("ok")
"""


def test_a_program_with_its_own_sdk_traces_through_the_public_api(redis_url: str) -> None:
    # A subprocess: the global tracer provider can be set once per process.
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(PUBLIC_API), redis_url, "plaita:test:traced"],
        cwd=ROOT,
        env=worker_env(redis_url),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]


NO_OTEL = """
import sys

class NoOpenTelemetry:
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None

sys.meta_path.insert(0, NoOpenTelemetry())

from plaita.flows import tracing
from tests.flows import fanout_flows, flowdefs
from tests.flows.support import Harness, start

TP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
h = Harness(sys.argv[1], [*flowdefs.FLOWS, *fanout_flows.FLOWS])
doc = h.run({**start("n1"), "traceparent": TP})
assert doc["status"] == "completed" and doc["traceparent"] == TP, doc
doc = h.run({**start("n2"), "traceparent": "garbage"})
assert doc["status"] == "completed" and "traceparent" not in doc, doc
h.flows.start("signup", execution_id="n3")  # the producer side: enqueued only
h.run(start("n3", "signup"))
h.flows.resume("n3", "event", "x")
h.run({"type": "start", "flow_id": "fan", "execution_id": "n4", "params": {"n": 1}})
assert tracing.otel_api() is None and not any(m.startswith("opentelemetry") for m in sys.modules)
h.close()
print("ok")
"""


def test_plaita_runs_without_opentelemetry_installed(redis_url: str) -> None:
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(NO_OTEL), redis_url],
        cwd=ROOT,
        env=worker_env(redis_url),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
