"""A parent with N children of one trivial step, on one worker process (``--concurrency 4``):
time from the parent's start to its join, and Redis commands per child (``INFO commandstats``).

``python -m bench.fanout [--children 100] [--runs 5]`` (starts its own redis-server).
"""

from __future__ import annotations

import argparse
import json
import time
import uuid

from bench.common import WorkerProcess, client_for, median, wait_for
from bench.flows import _commandstats
from tests.support.redis_server import RedisServer

STREAM = "plaita:bench:fanout"


def one_run(url: str, children: int) -> tuple[float, dict[str, int]]:
    client = client_for(url)
    client.config_resetstat()
    eid = uuid.uuid4().hex
    body = {"type": "start", "flow_id": "bench-fan", "execution_id": eid, "params": {"n": children}}
    began = time.perf_counter()
    client.xadd(STREAM, {"payload": json.dumps(body), "schema_version": "1"})

    def joined() -> bool:  # ZSCORE: a command the worker never sends, left out of the counts
        return client.zscore("plaita:executions:status:completed", eid) is not None

    assert wait_for(joined, 120, poll_s=0.002), "the parent never joined"
    elapsed = time.perf_counter() - began
    stats = _commandstats(client)
    client.close()
    return elapsed, stats


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.fanout")
    p.add_argument("--children", type=int, default=100)
    p.add_argument("--runs", type=int, default=5)
    a = p.parse_args()
    args = ["--flows", "bench.flowdefs", "--concurrency", "4", "--no-registry"]
    with RedisServer(persist=False) as server:
        w = WorkerProcess(server.url, stream=STREAM, group="plaita-workers", extra_args=args)
        with w:
            w.wait_state("READING")
            results = [one_run(server.url, a.children) for _ in range(a.runs)]
    times = [t for t, _ in results]
    stats = results[-1][1]
    ours = {k: v for k, v in stats.items() if k not in {"info", "config|resetstat", "zscore"} and v}
    total = sum(ours.values())
    scripts = ours.get("evalsha", 0) + ours.get("eval", 0)
    print(
        f"children={a.children} runs={a.runs} start->join median {median(times) * 1000:.0f} ms "
        f"(min {min(times) * 1000:.0f}, max {max(times) * 1000:.0f})"
    )
    print(
        f"Redis commands per child (last run, the bench's own calls excluded; commands inside scripts "
        f"counted too): {total / a.children:.1f}, of them {scripts / a.children:.1f} script calls"
    )
    print("by command:", json.dumps(dict(sorted(ours.items(), key=lambda kv: -kv[1]))))


if __name__ == "__main__":
    main()
