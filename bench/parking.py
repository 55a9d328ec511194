"""Starts waiting for a ``max_concurrent`` slot: how often waiting tasks are read again, and
whether they run in the order they were started.

STARTS starts of a flow with ``max_concurrent=3`` (a 50 ms step) go to two flow workers
(``--concurrency 4``, defaults otherwise) at once. Re-reads: task reads beyond one per start
(the worker counters ``completed`` + ``handed_back``, less STARTS). Out of order: runs that began
before a start enqueued earlier than them (pairs counted over the recorded run order).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import redis

from bench.common import WorkerProcess, wait_for
from bench.parkdefs import SLOTS3_ORDER

STARTS = 355
STREAM = "bench:parking"


@dataclass(frozen=True)
class ParkingResult:
    starts: int
    reads: int
    handed_back: int
    out_of_order: int

    @property
    def re_reads(self) -> int:
        return self.reads - self.starts


def _inversions(order: list[int]) -> int:
    """Pairs that ran in the opposite order of their start (O(n²) is fine for a few hundred)."""
    return sum(1 for i in range(len(order)) for j in range(i + 1, len(order)) if order[i] > order[j])


def run(url: str) -> ParkingResult:
    client = redis.Redis.from_url(url, socket_timeout=30)
    client.flushdb()
    os.environ["PLAITA_BENCH_REDIS_URL"] = url
    args = ["--no-registry", "--flows", "bench.parkdefs", "--concurrency", "4"]
    try:
        with (
            WorkerProcess(url, stream=STREAM, group="plaita-workers", extra_args=args) as a,
            WorkerProcess(url, stream=STREAM, group="plaita-workers", extra_args=args) as b,
        ):
            a.wait_state("READING")
            b.wait_state("READING")
            pipe = client.pipeline(transaction=True)
            for i in range(STARTS):
                body = {"type": "start", "flow_id": "bench-slots3", "execution_id": f"p-{i}", "params": {}}
                pipe.xadd(STREAM, {"payload": json.dumps(body), "schema_version": "1"})
            pipe.execute()
            if not wait_for(lambda: int(client.llen(SLOTS3_ORDER)) >= STARTS, 300, 0.05):
                raise RuntimeError("parking: not every start ran within 300 s")
            wait_for(lambda: a.counter("completed") + b.counter("completed") >= STARTS, 10, 0.05)
            reads = sum(w.counter("completed") + w.counter("handed_back") for w in (a, b))
            handed = sum(w.counter("handed_back") for w in (a, b))
        order = [int(x.decode().split("-")[1]) for x in client.lrange(SLOTS3_ORDER, 0, -1)]  # type: ignore[union-attr]
        return ParkingResult(STARTS, reads, handed, _inversions(order))
    finally:
        client.close()


def render(r: ParkingResult) -> str:
    return "\n".join(
        [
            "## Starts waiting for a slot",
            "",
            f"`python -m bench.parking`: {r.starts} starts of a `max_concurrent=3` flow (a 50 ms step) on two flow "
            "workers (`--concurrency 4`). Re-reads: task reads beyond one per start; out of order: pairs of runs "
            "that began in the opposite order of their starts.",
            "",
            "| starts | task reads | re-reads | handed back | out-of-order pairs |",
            "|---|---|---|---|---|",
            f"| {r.starts} | {r.reads} | {r.re_reads} | {r.handed_back} | {r.out_of_order} |",
            "",
        ]
    )


if __name__ == "__main__":
    from tests.support.redis_server import RedisServer

    with RedisServer(persist=False) as server:
        print(render(run(server.url)))
