"""``--pool process`` against the thread pool, one worker process, in one run: a 3-step flow and
plain tasks with 0 ms and 10 ms steps (per-task time, process/thread), and what a step that kills
its process costs the innocent executions beside it (time until they all completed).

``python -m bench.pool [--executions 600] [--tasks 3000] [--concurrency 4] [--rounds 2]``
(starts its own redis-server; rounds interleave the pool kinds and each keeps its median).
In threads a crash kills the worker: a restart loop here plays the supervisor (systemd's
``Restart=always``), under the same consumer name, and crash attribution does the rest.
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import redis

from bench.common import WorkerProcess, client_for, median, wait_for
from tests.support.redis_server import RedisServer

POOLS = ("thread", "process")
#: Innocents beside the poison in the crash runs, and their steps' length.
CRASH_INNOCENTS = 40
CRASH_STEP_MS = 10


@dataclass
class Run:
    seconds: float
    restarts: int = 0


def _flow_body(i: int, ms: float, *, crash: bool = False) -> dict[str, str]:
    params = {"ms": ms, **({"crash": True} if crash else {})}
    body = {"type": "start", "flow_id": "bench-pool3", "execution_id": f"e-{i}", "params": params}
    return {"payload": json.dumps(body), "schema_version": "1"}


def _task_body(i: int, ms: float) -> dict[str, str]:
    return {
        "payload": json.dumps({"type": "start", "flow_id": "x", "params": {"n": i, "ms": ms}}),
        "schema_version": "1",
    }


def _enqueue(client: redis.Redis, stream: str, bodies: list[dict[str, str]]) -> None:
    pipe = client.pipeline(transaction=True)  # all at once: the worker sees a full queue
    for b in bodies:
        pipe.xadd(stream, b)  # type: ignore[arg-type]
    pipe.execute()


def _worker(url: str, stream: str, pool: str, concurrency: int, target: list[str], name: str) -> WorkerProcess:
    """``target``: ``["--flows", MODULE]`` or ``["--handler", MODULE:CALLABLE]``."""
    args = ["--concurrency", str(concurrency), "--no-registry", "--pool", pool]
    args += [
        "--read-block-ms",
        "100",
        "--lease-ttl-s",
        "2",
        "--claim-min-idle-ms",
        "2000",
        "--reclaim-interval-s",
        "0.2",
    ]
    flows = target[0] == "--flows"
    handler = "plaita.runtime.handlers:noop" if flows else target[1]
    return WorkerProcess(url, stream=stream, group="plaita-workers", consumer_name=name,
                         extra_args=[*args, *(target if flows else [])], handler=handler)  # fmt: skip


def _timed(
    url: str,
    pool: str,
    concurrency: int,
    target: list[str],
    bodies: list[dict[str, str]],
    done: Callable[[redis.Redis, str], bool],
) -> Run:
    """Start a worker, enqueue ``bodies`` once it reads, time until ``done``; a worker that exits
    (threads, a crash) is restarted under the same name at once."""
    stream, name = f"plaita:bench:pool:{uuid.uuid4().hex[:8]}", f"bench-pool-{uuid.uuid4().hex[:6]}"
    client = client_for(url)
    workers = [_worker(url, stream, pool, concurrency, target, name)]
    try:
        workers[0].wait_state("READING")
        began = time.perf_counter()
        _enqueue(client, stream, bodies)

        def finished() -> bool:
            if not workers[-1].alive():
                workers.append(_worker(url, stream, pool, concurrency, target, name))
            return done(client, stream)

        assert wait_for(finished, 600, poll_s=0.005), f"{pool}: not done; {workers[-1].stderr_tail()}"
        return Run(time.perf_counter() - began, len(workers) - 1)
    finally:
        for w in workers:
            w.close()
        client.close()


def _completed(n: int) -> Callable[[redis.Redis, str], bool]:
    return lambda client, _stream: int(client.zcard("plaita:executions:status:completed")) >= n


def _acked(n: int) -> Callable[[redis.Redis, str], bool]:
    def done(client: redis.Redis, stream: str) -> bool:
        groups = client.xinfo_groups(stream)
        return bool(groups) and int(groups[0]["entries-read"] or 0) >= n and int(groups[0]["pending"]) == 0

    return done


def _fresh(url: str) -> None:
    client = client_for(url)
    client.flushall()
    client.close()


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.pool")
    p.add_argument("--executions", type=int, default=600)
    p.add_argument("--tasks", type=int, default=3000)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--only", default="", help="run only the workloads whose name contains this")
    a = p.parse_args()
    c, flows = a.concurrency, ["--flows", "bench.pooldefs"]
    workloads: list[tuple[str, int, Callable[[str], Run]]] = []
    for ms in (0, 10):
        n_ex = a.executions if ms == 0 else max(40, a.executions // 6)
        n_tk = a.tasks if ms == 0 else max(200, a.tasks // 6)
        for pool in POOLS:
            workloads.append(
                (
                    f"3-step flow, {ms} ms steps|{pool}",
                    n_ex,
                    lambda url, pool=pool, ms=ms, n=n_ex: _timed(
                        url, pool, c, flows, [_flow_body(i, ms) for i in range(n)], _completed(n)
                    ),
                )
            )
            workloads.append(
                (
                    f"plain tasks, {ms} ms handler|{pool}",
                    n_tk,
                    lambda url, pool=pool, ms=ms, n=n_tk: _timed(
                        url,
                        pool,
                        c,
                        ["--handler", "bench.pooldefs:nap"],
                        [_task_body(i, ms) for i in range(n)],
                        _acked(n),
                    ),
                )
            )
    for pool in POOLS:
        for poison in (False, True):
            bodies = [_flow_body(i, CRASH_STEP_MS) for i in range(CRASH_INNOCENTS)]
            if poison:
                bodies.insert(CRASH_INNOCENTS // 2, _flow_body(-1, CRASH_STEP_MS, crash=True))
            label = f"{CRASH_INNOCENTS} innocents {'+ 1 poison (os._exit)' if poison else 'alone'}|{pool}"
            workloads.append((label, CRASH_INNOCENTS, lambda url, pool=pool, b=bodies: _timed(
                url, pool, c, flows, b, _completed(CRASH_INNOCENTS))))  # fmt: skip
    workloads = [w for w in workloads if a.only in w[0]]
    results: dict[str, list[Run]] = {}
    with RedisServer(persist=False) as server:
        for r in range(a.rounds):
            for label, _n, fn in workloads:
                _fresh(server.url)
                results.setdefault(label, []).append(fn(server.url))
                print(f"round {r + 1} {label}: {results[label][-1]}", flush=True)
    _report(workloads, results, c)


def _report(workloads: list[tuple[str, int, Callable[[str], Run]]], results: dict[str, list[Run]], c: int) -> None:
    rounds = len(next(iter(results.values())))
    print(f"\n--concurrency {c}, one worker process, {rounds} rounds (pools interleaved in each)\n")
    print("| workload | per task, threads | per task, process | process / threads: median (each round) |")
    print("|---|---|---|---|")
    sizes = {label.split("|")[0]: n for label, n, _ in workloads}
    for name, n in sizes.items():
        t, pr = ([x.seconds for x in results[f"{name}|{pool}"]] for pool in POOLS)
        ratios = [p / q for p, q in zip(pr, t, strict=True)]  # each round's pair ran under the same load
        each = ", ".join(f"{r:.2f}" for r in ratios)
        per_task = f"{median(t) / n * 1000:.2f} ms | {median(pr) / n * 1000:.2f} ms"
        print(f"| {name} | {per_task} | {median(ratios):.2f}× ({each}) |")
    restarts = [x.restarts for label, runs in results.items() if "poison" in label and "thread" in label for x in runs]
    print(f"\nworker restarts in threads with the poison, per round: {restarts}")


if __name__ == "__main__":
    main()
