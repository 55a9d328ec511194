"""The soak's fault side: a seeded fault schedule, the nemesis that applies it, and a small
supervisor that restarts worker processes as systemd (``Restart=always``) would.

The schedule is a pure function of (seed, duration, workers): the same seed gives the same
faults at the same offsets. Faults on one target (the queue's Redis, or one worker slot) are
applied one at a time; faults on different targets overlap freely, so bursts and
combinations happen (a Redis freeze while a worker is being killed).
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import redis

from bench.common import ROOT, Subprocess
from tests.support.proxy import FaultProxy
from tests.support.redis_server import RedisServer

#: Fault kinds and their weights in the schedule.
KINDS: dict[str, int] = {
    "redis_sigstop": 3,
    "redis_kill9": 2,
    "proxy_blackhole": 3,
    "proxy_reset": 3,
    "proxy_latency": 2,
    "worker_kill9": 3,
    "worker_sigterm": 2,
    "remote_pause": 2,
    "remote_stop": 1,
    "group_destroy": 1,
    "poison_step": 1,
}
#: Kinds whose target is one worker slot (the rest target the queue's Redis).
SLOT_KINDS = {
    "proxy_blackhole",
    "proxy_reset",
    "proxy_latency",
    "worker_kill9",
    "worker_sigterm",
    "remote_pause",
    "remote_stop",
}
#: Kinds after which the slot's worker exits (the supervisor restarts it).
EXIT_KINDS = {"worker_kill9", "worker_sigterm", "remote_stop"}
#: Mean gap between fault starts, seconds.
MEAN_GAP_S = 3.0
#: Seeds the poison step a schedule without one gets (``schedule``).
POISON_SEED_OFFSET = 1_000_003
#: systemd's RestartSec for the supervisor.
RESTART_DELAY_S = 0.5


@dataclass(frozen=True)
class Fault:
    at_s: float
    kind: str
    target: str  # "redis" or "slot-N"
    duration_s: float
    latency_ms: int = 0
    #: ``poison_step``: how its step kills its worker process (``bench.soak_flows.CRASHES``).
    crash: str = ""


def schedule(seed: int, duration_s: float, workers: int) -> list[Fault]:
    """The seeded fault schedule: every fault starts and ends within ``duration_s``."""
    rng = random.Random(seed)
    kinds = sorted(KINDS)
    weights = [KINDS[k] for k in kinds]
    faults: list[Fault] = []
    t = rng.uniform(1.0, 3.0)
    while t < duration_s - 2.0:
        kind = rng.choices(kinds, weights)[0]
        target = f"slot-{rng.randrange(workers)}" if kind in SLOT_KINDS else "redis"
        duration = (
            round(rng.uniform(1.0, 8.0), 2)
            if kind in ("redis_sigstop", "proxy_blackhole", "proxy_latency", "remote_pause")
            else round(rng.uniform(0.3, 2.0), 2)
        )
        duration = min(duration, max(0.1, duration_s - t - 0.5))
        latency = rng.randint(50, 300) if kind == "proxy_latency" else 0
        crash = rng.choice(("exit", "sigkill", "segv")) if kind == "poison_step" else ""
        faults.append(Fault(round(t, 2), kind, target, duration, latency, crash))
        t += rng.expovariate(1.0 / MEAN_GAP_S)
    if duration_s >= 20 and not any(f.kind == "poison_step" for f in faults):
        # Every soak meets a poison step at least once (its own generator: the rest stays as it was).
        extra = random.Random(seed + POISON_SEED_OFFSET)
        at_s = round(extra.uniform(0.2, 0.5) * duration_s, 2)
        faults.append(Fault(at_s, "poison_step", "redis", 0.1, 0, extra.choice(("exit", "sigkill", "segv"))))
        faults.sort(key=lambda f: f.at_s)
    return faults


# -- the supervisor ------------------------------------------------------------------------


@dataclass
class Slot:
    index: int
    proxy: FaultProxy
    proc: Subprocess | None = None
    expect_exit: int = 0  # exits the nemesis caused and has not seen yet
    restart_at: float = 0.0


@dataclass
class Supervisor:
    """Keeps one worker process per slot running; logs every start and exit."""

    queue_server: RedisServer
    history_url: str
    workers: int
    worker_args: list[str]
    log_dir: Path
    slots: list[Slot] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    restarting: bool = True

    def start(self) -> None:
        for i in range(self.workers):
            slot = Slot(i, FaultProxy(self.queue_server.port))
            self.slots.append(slot)
            self._spawn(slot)
        threading.Thread(target=self._watch, name="soak-supervisor", daemon=True).start()

    def consumer(self, slot: Slot) -> str:
        return f"soak-{slot.index}"

    def _spawn(self, slot: Slot) -> None:
        consumer = self.consumer(slot)
        args = [
            sys.executable,
            "-m",
            "plaita",
            "--log-level",
            "WARNING",
            "worker",
            "--redis-url",
            slot.proxy.url,
            "--consumer-name",
            consumer,
            *self.worker_args,
        ]
        env = {
            "PLAITA_SOAK_HISTORY_URL": self.history_url,
            "PLAITA_REDIS_URL": slot.proxy.url,
            "PLAITA_CONSUMER_NAME": consumer,
        }
        slot.proc = Subprocess(args, env=env, prefix=f"plaita-soak-{consumer}-")
        self._log("start", slot, pid=slot.proc.pid)

    def _log(self, event: str, slot: Slot, **extra: Any) -> None:
        with self._lock:
            self.events.append({"event": event, "slot": slot.index, "t": time.time(), **extra})

    def _watch(self) -> None:
        while not self._stop.wait(0.05):
            for slot in self.slots:
                self._check(slot)

    def _check(self, slot: Slot) -> None:
        with self._lock:
            proc = slot.proc
            if proc is None or proc.alive():
                if proc is None and self.restarting and 0 < slot.restart_at <= time.monotonic():
                    slot.restart_at = 0.0
                    restart = True
                else:
                    return
            else:
                restart = False
        if restart:
            self._spawn(slot)
            return
        rc = proc.proc.returncode
        expected = slot.expect_exit > 0
        if expected:
            slot.expect_exit -= 1
        tail = "" if expected else proc.stderr_tail(1500)
        (self.log_dir / f"worker-{slot.index}-{proc.pid}.stderr").write_text(proc.stderr_tail(20000))
        proc.close()
        self._log("exit", slot, pid=proc.pid, rc=rc, expected=expected, stderr_tail=tail)
        with self._lock:
            slot.proc = None
            slot.restart_at = time.monotonic() + RESTART_DELAY_S

    def stop_all(self, drain_bound_s: float) -> list[dict[str, Any]]:
        """SIGTERM every worker at once; how long each took to exit (the drain check)."""
        self.restarting = False
        self._stop.set()
        time.sleep(0.1)
        procs = [(s, s.proc) for s in self.slots if s.proc is not None and s.proc.alive()]
        t0 = time.monotonic()
        for _slot, proc in procs:
            proc.proc.terminate()
        results = []
        for slot, proc in procs:
            try:
                rc: int | None = proc.proc.wait(max(0.1, drain_bound_s + 5 - (time.monotonic() - t0)))
            except subprocess.TimeoutExpired:
                rc = None
            results.append({"slot": slot.index, "pid": proc.pid, "rc": rc, "exit_s": round(time.monotonic() - t0, 3)})
            (self.log_dir / f"worker-{slot.index}-{proc.pid}.stderr").write_text(proc.stderr_tail(20000))
            proc.close()
            slot.proc = None
        for slot in self.slots:
            slot.proxy.close()
        return results


# -- the nemesis ---------------------------------------------------------------------------


class Nemesis:
    """Applies a schedule on threads; one fault at a time per target. Logs real times."""

    def __init__(self, faults: list[Fault], server: RedisServer, sup: Supervisor, queue: str, group: str) -> None:
        self.faults = faults
        self.server = server
        self.sup = sup
        self.queue = queue
        self.group = group
        self.log: list[dict[str, Any]] = []
        self._locks = {"redis": threading.Lock(), **{f"slot-{i}": threading.Lock() for i in range(sup.workers)}}
        self._log_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self.t0 = 0.0

    def start(self) -> None:
        self.t0 = time.monotonic()
        for f in self.faults:
            th = threading.Thread(target=self._apply, args=(f,), name=f"nemesis-{f.kind}", daemon=True)
            th.start()
            self._threads.append(th)

    def join(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for th in self._threads:
            th.join(max(0.0, deadline - time.monotonic()))

    def _apply(self, f: Fault) -> None:
        delay = self.t0 + f.at_s - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        with self._locks[f.target]:
            started = time.time()
            note = ""
            try:
                note = self._do(f)
            except Exception as exc:  # a fault that could not be applied is logged, not fatal
                note = f"not applied: {type(exc).__name__}: {exc}"
            with self._log_lock:
                self.log.append({**asdict(f), "start": started, "end": time.time(), "note": note})

    def _slot(self, f: Fault) -> Slot:
        return self.sup.slots[int(f.target.split("-")[1])]

    def _do(self, f: Fault) -> str:
        if f.kind == "redis_sigstop":
            self.server.freeze()
            time.sleep(f.duration_s)
            self.server.thaw()
            return ""
        if f.kind == "redis_kill9":
            self.server.kill()
            time.sleep(f.duration_s)
            self.server.start()
            return ""
        if f.kind == "poison_step":
            return self._poison(f)
        if f.kind == "group_destroy":
            c = redis.Redis(host="127.0.0.1", port=self.server.port, socket_timeout=2)
            try:
                return f"destroyed={c.xgroup_destroy(self.queue, self.group)}"
            finally:
                c.close()
        return self._do_slot(f, self._slot(f))

    def _poison(self, f: Fault) -> str:
        """Start an execution whose step kills whichever worker process runs it (``f.crash``): it
        must end ``error`` within its crash strikes and fail nothing else (checker guarantee 11)."""
        eid = f"poison-{int(f.at_s * 100)}"
        body = {"type": "start", "flow_id": "soak-poison", "execution_id": eid, "params": {"crash": f.crash}}
        c = redis.Redis(host="127.0.0.1", port=self.server.port, socket_timeout=2)
        try:
            mid = c.xadd(self.queue, {"payload": json.dumps(body), "schema_version": "1"})
        finally:
            c.close()
        return f"id={eid} mid={mid.decode() if isinstance(mid, bytes) else mid}"

    def _do_slot(self, f: Fault, slot: Slot) -> str:
        proxy = slot.proxy
        if f.kind == "proxy_blackhole":
            proxy.blackhole()
            time.sleep(f.duration_s)
            proxy.restore()
            return ""
        if f.kind == "proxy_reset":
            return f"reset={proxy.reset_all()}"
        if f.kind == "proxy_latency":
            proxy.latency_s = f.latency_ms / 1000
            time.sleep(f.duration_s)
            proxy.latency_s = 0.0
            return ""
        proc = slot.proc
        if proc is None or not proc.alive():
            return "no live worker"
        if f.kind in EXIT_KINDS:
            with self.sup._lock:
                slot.expect_exit += 1
        if f.kind == "worker_kill9":
            proc.proc.kill()
            return f"pid={proc.pid}"
        if f.kind == "worker_sigterm":
            proc.proc.terminate()
            return f"pid={proc.pid}"
        if f.kind == "remote_pause":
            out = self._admin("pause", slot)
            time.sleep(f.duration_s)
            return out + "; " + self._admin("resume", slot)
        out = self._admin("stop", slot)  # remote_stop
        if "received" not in out:
            with self.sup._lock:
                slot.expect_exit -= 1
        return out

    def _admin(self, command: str, slot: Slot) -> str:
        args = [
            sys.executable,
            "-m",
            "plaita",
            command,
            self.sup.consumer(slot),
            "--redis-url",
            self.server.url,
            "--queue-name",
            self.queue,
            "--consumer-group",
            self.group,
        ]
        try:
            done = subprocess.run(args, capture_output=True, text=True, timeout=15, cwd=ROOT, check=False)
        except subprocess.TimeoutExpired:
            return f"{command}: timed out"
        return f"{command}: rc={done.returncode} {(done.stdout + done.stderr).strip()[:200]}"
