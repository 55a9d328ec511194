"""What tracing costs a worker: CPU per execution of a 3-step no-op flow with OpenTelemetry not
importable, installed but not configured (no tracer provider: the default), and configured (the
SDK with a batch processor into an in-memory exporter: every span made and exported, no I/O).

``python -m bench.tracing [--tasks 2000] [--rounds 3]`` (starts its own redis-server). Each round
runs every variant once, interleaved, on one worker process each (``--concurrency 1``); each
variant keeps its median. Every body carries a ``traceparent``, as a traced producer's would.
Also times the untraced check itself (``Tracing.active``) in this process.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import textwrap
import time
import timeit
from pathlib import Path

import redis

from bench.common import WorkerProcess, client_for, cpu_seconds, median, wait_for
from tests.support.redis_server import RedisServer

STREAM = "plaita:bench:tracing"
FLOW_STEPS = 3
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

#: ``sitecustomize.py`` of each variant (on the worker's PYTHONPATH), run before plaita starts.
VARIANTS = {
    "OpenTelemetry not installed": """
        import sys

        class NoOpenTelemetry:
            def find_spec(self, name, path=None, target=None):
                if name == "opentelemetry" or name.startswith("opentelemetry."):
                    raise ModuleNotFoundError(name)
                return None

        sys.meta_path.insert(0, NoOpenTelemetry())
    """,
    "installed, no tracer provider (default)": "",
    "SDK + batch processor + in-memory exporter": """
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(InMemorySpanExporter()))
        trace.set_tracer_provider(provider)
    """,
}


def _fill(client: redis.Redis, n: int, round_no: int) -> None:
    pipe = client.pipeline(transaction=True)
    for i in range(n):
        body = {"type": "start", "flow_id": "bench-noop3", "execution_id": f"bt-{round_no}-{i}", "params": {}}
        body["traceparent"] = TRACEPARENT
        pipe.xadd(STREAM, {"payload": json.dumps(body), "schema_version": "1"})
    pipe.execute()


def one_run(url: str, site_dir: Path, n: int, round_no: int) -> tuple[float, float]:
    """(worker CPU µs per execution, executions/s) of one drain of ``n`` starts."""
    client = client_for(url)
    client.flushall()
    client.xgroup_create(STREAM, "plaita-workers", id="0", mkstream=True)
    args = ["--no-registry", "--flows", "bench.flowdefs", "--concurrency", "1"]
    env = {"PYTHONPATH": str(site_dir)}  # WorkerProcess puts the repository first, then this
    with WorkerProcess(url, stream=STREAM, group="plaita-workers", extra_args=args, env=env) as w:
        w.wait_state("READING")
        cpu0, t0 = cpu_seconds(w.pid), time.monotonic()
        _fill(client, n, round_no)
        done = lambda: int(client.zcard("plaita:executions:status:completed")) >= n  # noqa: E731
        if not wait_for(done, 300, poll_s=0.01):
            raise RuntimeError(f"bench tracing: not done within 300 s: {w.stderr_tail()}")
        elapsed_s, cpu_s = time.monotonic() - t0, cpu_seconds(w.pid) - cpu0
    client.close()
    return cpu_s / n * 1e6, n / elapsed_s


def check_ns() -> dict[str, float]:
    """Nanoseconds of one untraced ``Tracing.active()`` call (what every task pays when off)."""
    from plaita.flows import tracing

    out = {}
    t = tracing.Tracing()
    assert t.active() is None, "a global tracer provider is set in the bench process"
    out["installed, no tracer provider"] = min(timeit.repeat(t.active, number=200_000, repeat=5)) / 200_000 * 1e9
    saved, tracing._api = tracing._api, False  # as when the import failed
    try:
        out["not installed"] = min(timeit.repeat(t.active, number=200_000, repeat=5)) / 200_000 * 1e9
    finally:
        tracing._api = saved
    return out


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.tracing")
    p.add_argument("--tasks", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="plaita-bench-tracing-") as tmp, RedisServer(persist=False) as server:
        dirs = {}
        for i, (name, code) in enumerate(VARIANTS.items()):
            dirs[name] = Path(tmp) / str(i)
            dirs[name].mkdir()
            (dirs[name] / "sitecustomize.py").write_text(textwrap.dedent(code), encoding="utf-8")
        for r in range(a.rounds):
            for name in VARIANTS:
                results[name].append(one_run(server.url, dirs[name], a.tasks, r))
    base = median([cpu for cpu, _ in results["OpenTelemetry not installed"]])
    print(f"{a.tasks} executions of a {FLOW_STEPS}-step no-op flow per run, {a.rounds} round(s), medians\n")
    print("| variant | worker CPU µs/execution | vs not installed | executions/s |")
    print("|---|---:|---:|---:|")
    for name, runs in results.items():
        cpu, rate = median([c for c, _ in runs]), median([x for _, x in runs])
        print(f"| {name} | {cpu:,.0f} | {cpu / base:.2f}x | {rate:,.0f} |")
    print()
    for name, ns in check_ns().items():
        print(f"untraced check, {name}: {ns:.0f} ns per task")


if __name__ == "__main__":
    main()
