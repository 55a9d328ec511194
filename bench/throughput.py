"""Throughput: a raw redis-py consume loop vs ``plaita worker`` subprocesses, same tasks, same server."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import redis

from bench.common import WorkerProcess, enqueue, group_pending

#: Raw loop: entries per XREADGROUP and its BLOCK.
RAW_COUNT = 100
RAW_BLOCK_MS = 100
#: How often the bench samples XLEN / XINFO GROUPS while a worker consumes.
POLL_S = 0.005


@dataclass(frozen=True)
class Throughput:
    """Completions counted after the first observed one, over the time to the last one."""

    label: str
    tasks: int
    seconds: float
    tasks_per_s: float


def _rate(label: str, total: int, done_at_first: int, t_first: float, t_last: float) -> Throughput:
    elapsed = max(t_last - t_first, 1e-9)
    return Throughput(label, total, t_last - t_first, (total - done_at_first) / elapsed)


def raw_loop(client: redis.Redis, stream: str, total: int, timeout_s: float) -> Throughput:
    """XREADGROUP COUNT 100 BLOCK 100 + one pipelined XACK+XDEL per batch; decodes each payload."""
    group = "bench-raw"
    client.xgroup_create(stream, group, id="0", mkstream=True)
    done = 0
    done_at_first = 0
    t_first: float | None = None
    t_last = time.monotonic()
    deadline = t_last + timeout_s
    while done < total:
        if time.monotonic() > deadline:
            raise RuntimeError(f"raw loop: only {done}/{total} tasks after {timeout_s} s")
        reply: Any = client.xreadgroup(group, "raw", {stream: ">"}, count=RAW_COUNT, block=RAW_BLOCK_MS)
        ids: list[bytes] = []
        for _stream, items in reply or []:
            for message_id, entry in items:
                json.loads(entry[b"payload"])
                ids.append(message_id)
        if not ids:
            continue
        pipe = client.pipeline(transaction=False)
        pipe.xack(stream, group, *ids)
        pipe.xdel(stream, *ids)
        pipe.execute()
        done += len(ids)
        t_last = time.monotonic()
        if t_first is None:
            t_first, done_at_first = t_last, done
    assert t_first is not None
    return _rate("raw redis-py loop", total, done_at_first, t_first, t_last)


def worker_run(
    url: str, client: redis.Redis, stream: str, total: int, label: str, extra_args: list[str], timeout_s: float
) -> Throughput:
    """Start ``plaita worker`` on a pre-filled stream; time first to last completion (XLEN, PEL)."""
    group = "bench-workers"
    t_first: float | None = None
    done_at_first = 0
    with WorkerProcess(url, stream=stream, group=group, extra_args=extra_args) as worker:
        deadline = time.monotonic() + timeout_s
        while True:
            now = time.monotonic()
            if now > deadline:
                raise RuntimeError(f"{label}: stream not drained after {timeout_s} s: {worker.stderr_tail()}")
            if worker.proc.poll() is not None:
                raise RuntimeError(f"{label}: worker exited with {worker.proc.returncode}: {worker.stderr_tail()}")
            pipe = client.pipeline(transaction=False)
            pipe.xlen(stream)
            length = int(pipe.execute()[0])
            pending = group_pending(client, stream, group) if length == 0 else -1
            stamp = time.monotonic()
            done = total - length
            if t_first is None and done > 0:
                t_first, done_at_first = stamp, done
            if length == 0 and pending == 0:
                t_last = stamp
                break
            time.sleep(POLL_S)
        code = worker.terminate()
        if code != 0:
            raise RuntimeError(f"{label}: worker exited {code}: {worker.stderr_tail()}")
    assert t_first is not None
    return _rate(label, total, done_at_first, t_first, t_last)


def run(url: str, total: int, timeout_s: float = 300.0) -> list[Throughput]:
    """Raw loop, then the worker with default settings, then with --concurrency 4 (fresh streams)."""
    client = redis.Redis.from_url(url, socket_timeout=10)
    results: list[Throughput] = []
    try:
        runs: list[tuple[str, str, list[str] | None]] = [
            ("bench:raw", "raw redis-py loop", None),
            ("bench:worker:default", "plaita worker (defaults)", []),
            ("bench:worker:c4", "plaita worker --concurrency 4", ["--concurrency", "4"]),
        ]
        for stream, label, extra in runs:
            client.delete(stream)
            enqueue(client, stream, total)
            try:
                if extra is None:
                    results.append(raw_loop(client, stream, total, timeout_s))
                else:
                    results.append(worker_run(url, client, stream, total, label, extra, timeout_s))
            finally:
                client.delete(stream, f"{stream}:dlq")
    finally:
        client.close()
    return results
