"""The public face: a program that imports only ``from plaita import ...`` defines a flow, runs a
worker from Python, starts and waits for executions, runs a plain handler and stops it all within
a bound, on the session's private redis-server."""

from __future__ import annotations

import _thread
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis

import plaita
from plaita import (
    ConfigError,
    Flow,
    FlowClient,
    Settings,
    StepContext,
    Task,
    WaitTimeout,
    build_worker,
    run_worker,
    start_worker,
)
from tests.support.ops import wait_until

ROOT = Path(__file__).resolve().parents[1]
#: An idle worker stops within a second (README); the bound leaves room for a loaded machine.
STOP_BOUND_S = 5.0
#: Threads the worker service and its keeper run on: none may outlive a stop.
SERVICE_THREADS = ("plaita-owner", "plaita-keeper")

pytestmark = pytest.mark.redis


def _settings(redis_url: str, queue: str, **changes: Any) -> Settings:
    return Settings(redis_url=redis_url, queue_name=queue, consumer_name=f"{queue}-c", **changes)


def _service_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name in SERVICE_THREADS and t.is_alive()]


def _unnamed_clients(rclient: redis.Redis) -> list[dict[str, Any]]:
    """Connections without CLIENT SETNAME: the worker names all of its own, a producer none."""
    return [c for c in rclient.client_list() if not c.get("name")]


def _two_step_flow(flow_id: str) -> Flow:
    flow = Flow(flow_id)

    @flow.step
    def double(ctx: StepContext) -> dict[str, Any]:
        ctx.set_progress({"doubling": ctx.params["n"]})  # readable at once (FlowClient.get_event)
        return {"n": ctx.params["n"] * 2}

    @flow.step
    async def describe(ctx: StepContext) -> dict[str, Any]:
        return {"text": f"{ctx.execution_id}: {ctx.state['n']}"}

    return flow


# -- the names ---------------------------------------------------------------------------
def test_every_name_in_all_exists_and_dir_lists_them() -> None:
    for name in plaita.__all__:
        assert getattr(plaita, name) is not None, name
    assert set(plaita.__all__) <= set(dir(plaita))
    assert plaita.__version__ == plaita.__dict__["__version__"] and plaita.__version__.count(".") == 2
    assert plaita.FlowClient is FlowClient and plaita.run_worker is run_worker
    with pytest.raises(AttributeError, match="no attribute 'NoSuchName'"):
        _ = plaita.NoSuchName  # type: ignore[attr-defined]


def test_import_plaita_loads_no_redis_and_no_layer_until_a_name_is_used() -> None:
    """A fresh interpreter: ``import plaita`` loads the exceptions only; the first use of a lazy
    name loads its module (so the laziness is real, not an empty face)."""
    code = (
        "import sys, plaita\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('redis', 'plaita'))\n"
        "assert loaded == ['plaita', 'plaita.errors', 'plaita.version'], loaded\n"
        "plaita.FlowClient\n"
        "assert 'redis' in sys.modules and 'plaita.flows.producer.client' in sys.modules\n"
        "from plaita import *\n"
        "assert run_worker is plaita.run_worker\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr


# -- a flow, end to end -------------------------------------------------------------------
def test_a_flow_runs_end_to_end_through_the_public_api(redis_url: str) -> None:
    flow = _two_step_flow("public-api")
    service = start_worker(_settings(redis_url, "pub:flows", concurrency=2), flows=[flow])
    try:
        with FlowClient.from_url(redis_url, queue_name="pub:flows") as flows:
            ids = [flows.start("public-api", {"n": n}, deadline_s=600) for n in (1, 2, 3)]
            docs = [flows.wait(eid, timeout_s=20) for eid in ids]
            progress = [flows.get_event(eid, "progress") for eid in ids]
            events = flows.events(ids[0])
            # A tenant's execution with the same id is another execution (FlowClient.for_tenant).
            acme = flows.for_tenant("acme")
            assert acme.tenant_id == "acme" and acme.start("public-api", {"n": 5}, execution_id=ids[0]) == ids[0]
            assert acme.wait(ids[0], timeout_s=20)["state"]["n"] == 10
            assert flows.get(ids[0]) == docs[0]
    finally:
        started_s = time.monotonic()
        stopped = service.stop(timeout_s=STOP_BOUND_S)
        stop_s = time.monotonic() - started_s
    assert [d["status"] for d in docs] == ["completed"] * 3
    want = [{"n": 2 * n, "text": f"{eid}: {2 * n}"} for n, eid in zip((1, 2, 3), ids, strict=True)]
    assert [d["state"] for d in docs] == want
    assert progress == [{"doubling": n} for n in (1, 2, 3)] and events == {"progress": {"doubling": 1}}
    assert all(isinstance(d["deadline_at"], float) for d in docs)
    assert stopped and stop_s < STOP_BOUND_S, stop_s
    assert _service_threads() == []


def test_from_url_starts_on_the_workers_partitions_and_close_releases_its_connections(
    redis_url: str, rclient: redis.Redis
) -> None:
    flow = _two_step_flow("public-parts")
    settings = _settings(redis_url, "pub:parts", partitions=3, registry_enabled=False)
    with (
        start_worker(settings, flows=[flow]),
        FlowClient.from_url(redis_url, queue_name="pub:parts", partitions=3) as flows,
    ):
        doc = flows.wait(flows.start("public-parts", {"n": 5}), timeout_s=20)
        assert doc["status"] == "completed" and doc["state"]["n"] == 10
        assert rclient.exists("pub:parts") == 0  # the partition streams carry it, not the plain key
        unnamed = len(_unnamed_clients(rclient))  # the FlowClient's connections, and rclient's own
    # Closing the FlowClient dropped its connections (the server sees each one go).
    wait_until(lambda: len(_unnamed_clients(rclient)) < unnamed, 5, "the FlowClient's connections to close")


def test_a_wait_that_times_out_is_a_public_error(redis_url: str) -> None:
    with FlowClient.from_url(redis_url, queue_name="pub:nobody") as flows:
        eid = flows.start("never-run", {})
        with pytest.raises(WaitTimeout, match="still queued"):  # recorded at start (issue 31, item 2)
            flows.wait(eid, timeout_s=0.2)


def test_an_embedded_keeper_hands_its_lease_over_when_the_worker_stops(redis_url: str, rclient: redis.Redis) -> None:
    service = start_worker(_settings(redis_url, "pub:keeper"), flows=[_two_step_flow("public-keeper")], keeper=True)
    try:
        wait_until(lambda: rclient.exists("plaita:keeper:lease:{pub:keeper}"), 10, "the keeper to take its lease")
    finally:
        assert service.stop(timeout_s=STOP_BOUND_S)
    assert rclient.exists("plaita:keeper:lease:{pub:keeper}") == 0
    assert _service_threads() == []


# -- a plain handler -----------------------------------------------------------------------
def test_a_plain_handler_runs_in_a_thread_and_stops_on_request_stop(redis_url: str, rclient: redis.Redis) -> None:
    seen: list[dict[str, Any]] = []

    def handle(task: Task) -> None:
        seen.append(task.body)

    service = build_worker(_settings(redis_url, "pub:plain"), handler=handle)
    thread = threading.Thread(target=service.run, kwargs={"signals": False}, name="caller")
    thread.start()
    try:
        with FlowClient.from_url(redis_url, queue_name="pub:plain") as producer:
            producer.queue.enqueue_many([{"type": "start", "execution_id": f"t{i}"} for i in range(5)])
        wait_until(lambda: len(seen) == 5, 20, "five tasks handled")
    finally:
        service.request_stop()
        thread.join(STOP_BOUND_S)
    assert not thread.is_alive() and service.join(0)
    assert sorted(b["execution_id"] for b in seen) == [f"t{i}" for i in range(5)]
    # Every ack reached Redis before the stop returned: nothing pending, nothing left in the stream.
    assert rclient.xpending("pub:plain", "plaita-workers")["pending"] == 0 and rclient.xlen("pub:plain") == 0


def test_run_worker_on_the_main_thread_stops_on_sigterm_and_restores_the_handler(redis_url: str) -> None:
    """What ``plaita worker`` does: SIGTERM drains and ``run_worker`` returns 0; the caller's
    SIGTERM handler is back afterwards."""
    handled = threading.Event()

    def handle(task: Task) -> None:
        handled.set()

    def producer() -> None:
        with FlowClient.from_url(redis_url, queue_name="pub:signal") as flows:
            flows.queue.enqueue({"type": "start", "execution_id": "sig"})
        if handled.wait(20):
            os.kill(os.getpid(), signal.SIGTERM)

    before = signal.getsignal(signal.SIGTERM)
    sender = threading.Thread(target=producer, daemon=True)
    sender.start()
    started_s = time.monotonic()
    assert run_worker(_settings(redis_url, "pub:signal"), handler=handle) == 0
    assert handled.is_set() and time.monotonic() - started_s < 20 + STOP_BOUND_S
    assert signal.getsignal(signal.SIGTERM) is before
    sender.join(STOP_BOUND_S)


def test_ctrl_c_with_signals_off_stops_the_worker_before_it_propagates(redis_url: str, rclient: redis.Redis) -> None:
    service = build_worker(_settings(redis_url, "pub:ctrlc"), handler=lambda task: None)

    def ctrl_c_once_consuming() -> None:
        wait_until(lambda: rclient.exists("pub:ctrlc"), 10, "the worker to create its group")
        _thread.interrupt_main()

    # A shell running the suite as a background job without job control starts it with SIGINT
    # ignored, and interrupt_main() then does nothing: Ctrl-C must mean KeyboardInterrupt here.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    presser = threading.Thread(target=ctrl_c_once_consuming, daemon=True)
    presser.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            service.run(signals=False)
        assert service.join(STOP_BOUND_S)  # stopped by run itself, not by the cleanup below
    finally:
        signal.signal(signal.SIGINT, previous)
        service.stop(STOP_BOUND_S)
        presser.join(STOP_BOUND_S)


# -- configuration errors --------------------------------------------------------------------
def test_configuration_errors_raise_before_anything_runs(redis_url: str) -> None:
    settings = _settings(redis_url, "pub:bad")
    with pytest.raises(ConfigError, match="needs --handler"):
        run_worker(settings)
    with pytest.raises(ConfigError, match="--handler cannot be combined with --flows or --keeper"):
        start_worker(settings, handler=lambda task: None, keeper=True)
    with pytest.raises(ConfigError, match="cannot import"):
        start_worker(settings, flows=["no_such_module_here"])
    with pytest.raises(ConfigError, match="'no_such_module_here': cannot import"):  # one name, not its letters
        start_worker(settings, flows="no_such_module_here")
    with pytest.raises(ConfigError, match="MODULE:CALLABLE"):
        start_worker(settings, handler="no-colon")
    with pytest.raises(ConfigError, match="invalid --redis-url"):
        FlowClient.from_url("http://nowhere")
    failure: list[BaseException] = []

    def off_main() -> None:
        try:
            run_worker(settings, handler=lambda task: None)
        except ConfigError as exc:
            failure.append(exc)

    thread = threading.Thread(target=off_main)
    thread.start()
    thread.join(STOP_BOUND_S)
    assert failure and "signals=False" in str(failure[0])
    assert _service_threads() == []


def test_flow_limits_are_options_of_flow() -> None:
    """``Flow(max_concurrent=, max_starts_per_s=)`` (docs/flows.md, "Fleet-wide limits")."""
    flow = Flow("limited", max_concurrent=2, max_starts_per_s=5)
    assert (flow.max_concurrent, flow.max_starts_per_s, flow.start_burst) == (2, 5, 5.0)
    with pytest.raises(ConfigError):
        Flow("limited", max_concurrent=0)


def test_alert_webhook_from_settings_posts_a_dead_letter(redis_url: str) -> None:
    from tests.support.webhook import webhook

    def reject(task: Task) -> None:
        raise plaita.BadTaskError("not for us")

    with pytest.raises(ConfigError, match="--alert-webhook"):
        _settings(redis_url, "pub:alerts", alert_webhook="ftp://hooks.example.com/x")
    with webhook() as hook:
        settings = _settings(redis_url, "pub:alerts", alert_webhook=hook.url, alert_webhook_secret="k")
        with start_worker(settings, handler=reject) as service:
            with FlowClient.from_url(redis_url, queue_name="pub:alerts") as producer:
                producer.queue.enqueue({"type": "start", "execution_id": "pa1"})
            (got,) = hook.wait_for(1, 20)
            service.request_stop()
            assert service.join(STOP_BOUND_S)
    assert got.doc["event"] == "dead_letter" and got.doc["execution_id"] == "pa1"
    assert got.headers["x-plaita-signature"].startswith("sha256=")
