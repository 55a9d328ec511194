"""The soak's keepers: two ``plaita keeper --flows bench.soak_flows`` processes (the schedule's
ticks, durable-sleep wakes, recovery), one killed -9 and restarted on a seeded schedule.

They run apart from the workers, with a short keeper lease (``--keeper-lease-ttl-s 3``): a
keeper inside a worker (``worker --keeper``) keeps the default 30 s lease, so each kill -9 of
the worker that held it stopped every sleep, timeout and tick for 30 s (seen in the first runs
of this soak), which says nothing new and would make the CI soak half a minute longer. Killing
a keeper here still makes the other take over mid-schedule: the ticks must still run once each.
"""

from __future__ import annotations

import random
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import Subprocess

KEEPERS = 2
#: ``--timeout-cooldown-s 5``: the keeper re-arms a due deadline before it enqueues the wake, so
#: a wake whose XADD failed (Redis froze in between, or the keeper was killed) is sent again only
#: after this cooldown: with the default 60 s a sleep in the soak woke 62 s late.
KEEPER_ARGS = ["--interval-s", "1", "--keeper-lease-ttl-s", "3", "--timeout-cooldown-s", "5"]
#: Mean gap between keeper kills, seconds (exponential), and the supervisor's restart delay.
KILL_GAP_S = 12.0
RESTART_DELAY_S = 0.5


class Keepers:
    """Keeps ``KEEPERS`` keeper processes running; kills one now and then until ``stop_kills``."""

    def __init__(self, redis_url: str, history_url: str, seed: int, log_dir: Path) -> None:
        self.redis_url = redis_url
        self.env = {"PLAITA_SOAK_HISTORY_URL": history_url, "PLAITA_REDIS_URL": redis_url}
        self.rng = random.Random(seed + 2)
        self.log_dir = log_dir
        self.procs: list[Subprocess | None] = [None] * KEEPERS
        self.events: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._kill_now_and_then, name="soak-keepers", daemon=True)

    def start(self) -> None:
        for i in range(KEEPERS):
            self._spawn(i)
        self._thread.start()

    def _spawn(self, i: int) -> None:
        args = [sys.executable, "-m", "plaita", "--log-level", "WARNING", "keeper", "--redis-url", self.redis_url]
        proc = Subprocess([*args, "--flows", "bench.soak_flows", *KEEPER_ARGS], env=self.env, prefix="plaita-soak-k-")
        self.procs[i] = proc
        self.events.append({"event": "start", "keeper": i, "pid": proc.pid, "t": time.time()})

    def _kill_now_and_then(self) -> None:
        while not self._stop.wait(self.rng.expovariate(1.0 / KILL_GAP_S)):
            i = self.rng.randrange(KEEPERS)
            proc = self.procs[i]
            if proc is None:
                continue
            if not proc.alive():  # died by itself: the checker reports it
                self.events.append({"event": "died", "keeper": i, "pid": proc.pid, "t": time.time()})
            proc.kill9()
            self.events.append({"event": "kill9", "keeper": i, "pid": proc.pid, "t": time.time()})
            self._keep_log(i, proc)
            self._stop.wait(RESTART_DELAY_S)  # restarted even when stopping: both must run to the end
            self._spawn(i)

    def stop_kills(self) -> None:
        self._stop.set()
        if self._thread.is_alive():  # never started when the soak failed before its keepers
            self._thread.join(30)

    def stop_all(self, timeout_s: float) -> list[dict[str, Any]]:
        """SIGTERM every keeper at once (after ``stop_kills``): whether each was alive, its exit
        code, how long it took."""
        procs = [(i, p) for i, p in enumerate(self.procs) if p is not None]
        alive = {i: p.alive() for i, p in procs}
        t0 = time.monotonic()
        for _i, p in procs:
            p.proc.terminate()
        out = []
        for i, p in procs:
            try:
                rc: int | None = p.proc.wait(max(0.1, timeout_s - (time.monotonic() - t0)))
            except subprocess.TimeoutExpired:
                rc = None  # close() kills it; the checker reports it
            out.append(
                {"keeper": i, "pid": p.pid, "alive": alive[i], "rc": rc, "exit_s": round(time.monotonic() - t0, 3)}
            )
            self._keep_log(i, p)
            self.procs[i] = None
        return out

    def close(self) -> None:
        """Stop the kills and kill what is left (the soak's ``finally``)."""
        self.stop_kills()
        for proc in self.procs:
            if proc is not None:
                proc.close()

    def _keep_log(self, i: int, proc: Subprocess) -> None:
        (self.log_dir / f"keeper-{i}-{proc.pid}.stderr").write_text(proc.stderr_tail(20000))
        proc.close()
