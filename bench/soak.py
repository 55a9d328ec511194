"""A nemesis soak: seeded random faults against N real worker processes, then an independent check.

    python -m bench.soak --minutes 10 --seed 7 [--workers 3] [--out DIR]
    python -m bench.soak --seconds 60 --seed 1 --out /tmp/soak     # the short form CI runs

Two private redis-servers on loopback (never 6379): the queue's (AOF, appendfsync always,
faulted) and the history's (never faulted). Each worker reaches the queue through its own
fault proxy. A producer starts executions at a steady rate and logs every XADD id it got
back; the nemesis applies the seeded schedule; afterwards the producer goes on for a quiet
period, every execution is given time to finish, every worker gets SIGTERM, and
``bench.soak_checker`` judges the run from the files written to the output folder alone.
Exit status 1 when a guarantee fails.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import redis

from bench import soak_checker
from bench.common import client_for, exit_on_sigterm
from bench.soak_flows import CHILDREN, HISTORY_KEY, STAGED_PREFIX
from bench.soak_keepers import Keepers
from bench.soak_nemesis import Nemesis, Supervisor, schedule
from plaita.flows.model import bodies as model
from plaita.store.keyspace import DEFAULT
from tests.support.redis_server import RedisServer

QUEUE = "plaita:flow:queue"
GROUP = "plaita-workers"
DRAIN_TIMEOUT_S = 5.0
LEASE_TTL_S = 10.0
WORKER_ARGS = [
    "--flows",
    "bench.soak_flows",
    "--concurrency",
    "4",
    "--lease-ttl-s",
    str(LEASE_TTL_S),
    "--claim-min-idle-ms",
    "3000",
    "--reclaim-interval-s",
    "1",
    "--drain-timeout-s",
    str(DRAIN_TIMEOUT_S),
    "--max-deliveries",
    "50",
]
#: Mix of what the producer starts (weights).
MIX = {
    "soak-plain": 50,
    "soak-multi": 15,
    "soak-suspend": 10,
    "soak-retry": 10,
    "cancel": 5,
    "soak-fanout": 5,
    "soak-sleep": 5,
}
#: Durable sleeps last this long (uniform), so that most wake during the fault phase.
NAP_S = (0.5, 3.0)
#: The schedule's ticks the checker expects, each run exactly once: from the first one started
#: until this long before the producer stopped (a keeper passes every 5 s).
TICK_SLACK_S = 10
RESUME_AFTER_S = 2.0
CANCEL_AFTER_S = 0.3
#: After the nemesis stops, the producer goes on this long (recovery is measured here); a
#: sixth of the fault phase within these bounds, so the 60 s CI soak stays under 90 s.
QUIET_MIN_S, QUIET_MAX_S = 10.0, 15.0
#: Longest the producer goes on sending owed resumes and cancels after it stopped starting.
OWED_TIMEOUT_S = 15.0
#: Longest wait for every execution to end once the producer stopped.
SETTLE_TIMEOUT_S = 45.0


class Producer:
    """Starts executions at ``rate_per_s``; resumes the suspending ones, cancels the cancel targets."""

    def __init__(self, url: str, rate_per_s: float, seed: int) -> None:
        self.client = client_for(url, socket_timeout_s=3.0)
        self.every_s = 1.0 / rate_per_s
        self.rng = random.Random(seed + 1)
        self.log: list[dict[str, Any]] = []
        self.todo: list[tuple[float, str, str]] = []  # (due monotonic, op, execution id)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-producer", daemon=True)
        self.n = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            self._start_one()
            self._due(time.monotonic())
            next_at = max(next_at + self.every_s, time.monotonic())
            self._stop.wait(max(0.0, next_at - time.monotonic()))
        # Resumes and cancels still owed are sent (bounded): the executions must be able to end.
        deadline = time.monotonic() + OWED_TIMEOUT_S
        while self.todo and time.monotonic() < deadline:
            self._due(time.monotonic() + RESUME_AFTER_S)
            time.sleep(0.2)

    def _start_one(self) -> None:
        kind = self.rng.choices(list(MIX), list(MIX.values()))[0]
        flow = "soak-multi" if kind == "cancel" else kind
        eid = f"soak-{self.n:06d}"
        self.n += 1
        params = {"sleep_s": round(self.rng.uniform(0.3, 0.8) if kind == "cancel" else self.rng.uniform(0.01, 0.1), 3)}
        if kind == "soak-sleep":
            params["nap_s"] = round(self.rng.uniform(*NAP_S), 3)
        body = model.start_body(flow, params, eid)
        fields = {"payload": json.dumps(body, separators=(",", ":")), "schema_version": "1"}
        rec: dict[str, Any] = {"op": "start", "id": eid, "flow": flow, "intent": kind, "t": time.time()}
        try:
            mid = self.client.xadd(QUEUE, fields)  # type: ignore[arg-type]
            rec["mid"] = mid.decode() if isinstance(mid, bytes) else str(mid)
        except redis.RedisError as exc:
            rec["error"] = f"{type(exc).__name__}: {exc}"
        self.log.append(rec)
        if "mid" not in rec:
            return  # not acknowledged: it may or may not run, and nothing is owed to it
        if kind == "soak-suspend":
            self.todo.append((time.monotonic() + RESUME_AFTER_S, "resume", eid))
        elif kind == "cancel":
            self.todo.append((time.monotonic() + CANCEL_AFTER_S, "cancel", eid))

    def _due(self, now: float) -> None:
        later = []
        for due, op, eid in self.todo:
            if due > now or not self._send(op, eid):
                later.append((due if due > now else now + 1.0, op, eid))
        self.todo = later

    def _send(self, op: str, eid: str) -> bool:
        """One resume or cancel; False to try again later (state not there yet, or a Redis error)."""
        rec: dict[str, Any] = {"op": op, "id": eid, "t": time.time()}
        try:
            raw = self.client.get(DEFAULT.execution_key(eid))
            if raw is None:
                return False
            status = json.loads(raw).get("status")
            rec["status_seen"] = status
            if op == "cancel":
                self.client.set(DEFAULT.cancel_key(eid), "1", ex=7 * 86400)
                if status == "suspended":
                    body = model.resume_body(eid, "cancel", flow_id="soak-multi")
                    self.client.xadd(QUEUE, {"payload": json.dumps(body), "schema_version": "1"})  # type: ignore[arg-type]
            else:
                body = model.resume_body(eid, "event", flow_id="soak-suspend", data="go", resume_id=f"{eid}:go")
                mid = self.client.xadd(QUEUE, {"payload": json.dumps(body), "schema_version": "1"})  # type: ignore[arg-type]
                rec["mid"] = mid.decode() if isinstance(mid, bytes) else str(mid)
        except redis.RedisError as exc:
            rec["error"] = f"{type(exc).__name__}: {exc}"
            self.log.append(rec)
            return False
        self.log.append(rec)
        return True


def _final_state(server: RedisServer, history: redis.Redis, owed: list[str]) -> dict[str, Any]:
    """What the checker needs from both servers, read once everything stopped: the executions
    started, owed (``owed``) or seen in the history (children, schedule ticks)."""
    lines = [json.loads(x) for x in history.lrange(HISTORY_KEY, 0, -1)]
    ids = sorted({*owed, *(r["id"] for r in lines)})
    c = server.client()
    try:
        docs: dict[str, Any] = {}
        staged: dict[str, int] = {}
        for lo in range(0, len(ids), 500):
            chunk = ids[lo : lo + 500]
            for eid, raw in zip(chunk, c.mget([DEFAULT.execution_key(i) for i in chunk]), strict=True):
                if raw is not None:
                    d = json.loads(raw)
                    docs[eid] = {"status": d.get("status"), "step": d.get("step"), "error": d.get("error")}
        for key in c.scan_iter(match=f"{STAGED_PREFIX}*", count=1000):
            staged[key.decode()[len(STAGED_PREFIX) :]] = int(c.get(key) or 0)
        dlq = [{k.decode(): v.decode() for k, v in f.items()} for _i, f in c.xrange(f"{QUEUE}:dlq")]
        stream_len = int(c.xlen(QUEUE)) if c.exists(QUEUE) else 0
    finally:
        c.close()
    return {"executions": docs, "staged": staged, "dlq": dlq, "stream_len": stream_len, "history": lines}


def _settle(server: RedisServer, ids: list[str]) -> float:
    """Wait (bounded) until every started execution is terminal; returns the seconds waited."""
    t0 = time.monotonic()
    c = server.client()
    try:
        while time.monotonic() - t0 < SETTLE_TIMEOUT_S:
            left = 0
            for lo in range(0, len(ids), 500):
                for raw in c.mget([DEFAULT.execution_key(i) for i in ids[lo : lo + 500]]):
                    if raw is None or json.loads(raw).get("status") not in ("completed", "cancelled", "error"):
                        left += 1
            if left == 0:
                break
            time.sleep(0.5)
    finally:
        c.close()
    return time.monotonic() - t0


def owed_ids(log: list[dict[str, Any]], times: dict[str, Any]) -> list[str]:
    """Executions that must end: the acknowledged starts, the children of the fan-out parents
    (their ids are derived: ``{parent}:{step}:{join}:{index}``) and the schedule's ticks from
    the soak's start to ``tick_until_s``."""
    starts = [r for r in log if r["op"] == "start" and "mid" in r]
    ids = [r["id"] for r in starts]
    for r in starts:
        if r["flow"] == "soak-fanout":
            ids += [f"{r['id']}:spawn:0:{i}" for i in range(CHILDREN)]
    ticks = range(times["tick_from_s"], times["tick_until_s"] + 1)
    return ids + [tick_id(t) for t in ticks]


def tick_id(tick_s: int) -> str:
    return f"schedule:soak-tick:{tick_s}"


def _first_tick(server: RedisServer, times: dict[str, Any]) -> int:
    """The first tick the keepers started (from a little before the soak: the first keeper pass
    starts the ticks of the schedule's grace period), or the start of the soak when none was."""
    lo = math.floor(times["t_start"]) - TICK_SLACK_S
    ticks = list(range(lo, times["tick_until_s"] + 1))
    c = server.client()
    try:
        found = c.mget([DEFAULT.execution_key(tick_id(t)) for t in ticks]) if ticks else []
    finally:
        c.close()
    return next((t for t, raw in zip(ticks, found, strict=True) if raw is not None), math.ceil(times["t_start"]))


def _drive(
    sup: Supervisor, keepers: Keepers, producer: Producer, nemesis: Nemesis, server: RedisServer, times: dict[str, Any]
) -> None:
    """The phases: start-up, faults with load, quiet load, settle, final SIGTERM (times noted)."""
    duration_s = times["duration_s"]
    sup.start()
    keepers.start()
    time.sleep(3.0)  # python start-up of the workers (not a synchronisation: faults may hit them anyway)
    times["t_start"] = time.time()
    producer.start()
    nemesis.start()
    print(f"soak: seed {times['seed']}, {len(nemesis.faults)} faults over {duration_s:.0f} s", flush=True)
    nemesis.join(duration_s + 60)
    rest_s = times["t_start"] + duration_s - time.time()
    if rest_s > 0:
        time.sleep(rest_s)  # the fault phase lasts its full length even when the last fault ended early
    times["t_nemesis_end"] = time.time()
    keepers.stop_kills()
    time.sleep(min(QUIET_MAX_S, max(QUIET_MIN_S, duration_s / 6)))
    producer.stop()
    times["t_producer_end"] = time.time()
    times["tick_until_s"] = int(times["t_producer_end"]) - TICK_SLACK_S
    times["tick_from_s"] = _first_tick(server, times)
    poisons = [f["note"].split()[0][3:] for f in nemesis.log if f["kind"] == "poison_step" and f["note"][:3] == "id="]
    times["settle_s"] = round(_settle(server, owed_ids(producer.log, times) + poisons), 2)
    times["keepers"] = keepers.stop_all(DRAIN_TIMEOUT_S)
    times["shutdown"] = sup.stop_all(DRAIN_TIMEOUT_S)
    times["t_end"] = time.time()


def run(duration_s: float, seed: int, workers: int, out: Path, rate_per_s: float) -> int:
    out.mkdir(parents=True, exist_ok=True)
    faults = schedule(seed, duration_s, workers)
    queue_server = RedisServer(persist=True).start()
    history_server = RedisServer(persist=False).start()
    history = history_server.client()
    sup = Supervisor(queue_server, history_server.url, workers, WORKER_ARGS, out)
    keepers = Keepers(queue_server.url, history_server.url, seed, out)
    producer = Producer(queue_server.url, rate_per_s, seed)
    nemesis = Nemesis(faults, queue_server, sup, QUEUE, GROUP)
    times: dict[str, Any] = {
        "seed": seed,
        "duration_s": duration_s,
        "workers": workers,
        "rate_per_s": rate_per_s,
        "drain_timeout_s": DRAIN_TIMEOUT_S,
        "lease_ttl_s": LEASE_TTL_S,
    }
    try:
        _drive(sup, keepers, producer, nemesis, queue_server, times)
        data = {
            "meta": times,
            "faults": nemesis.log,
            "producer": producer.log,
            "supervisor": sup.events,
            "keepers": keepers.events,
            **_final_state(queue_server, history, [r["id"] for r in producer.log if r["op"] == "start"]),
        }
        (out / "run.json").write_text(json.dumps(data))
    finally:
        sup.restarting = False
        keepers.close()
        for slot in sup.slots:
            if slot.proc is not None:
                slot.proc.close()
            slot.proxy.close()
        history.close()
        queue_server.stop()
        history_server.stop()
    return soak_checker.main([str(out)])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n\n")[0])
    length = p.add_mutually_exclusive_group()
    length.add_argument("--minutes", type=float, help="nemesis duration in minutes")
    length.add_argument("--seconds", type=float, help="nemesis duration in seconds (the short CI form)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--rate", type=float, default=10.0, help="executions started per second (default 10)")
    p.add_argument("--out", type=Path, default=None, help="output folder (default: a new temp dir)")
    args = p.parse_args(argv)
    duration_s = args.seconds if args.seconds is not None else 60.0 * (args.minutes or 1.0)
    if not 5 <= duration_s <= 24 * 3600 or not 1 <= args.workers <= 16 or not 0.1 <= args.rate <= 500:
        p.error("need 5 s <= duration <= 24 h, 1 <= --workers <= 16, 0.1 <= --rate <= 500")
    out = args.out or Path(tempfile.mkdtemp(prefix="plaita-soak-"))
    exit_on_sigterm()
    print(f"soak: output in {out}", flush=True)
    return run(duration_s, args.seed, args.workers, out, args.rate)


if __name__ == "__main__":
    sys.exit(main())
