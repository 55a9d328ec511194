"""The flow part of ``plaita demo``: a 3-step flow whose middle step suspends until the demo
resumes it with data, run by a flow worker of its own through the Redis freeze and one
``kill -9`` of that worker (restarted at once, as a supervisor would).

Every step run appends ``<monotonic> <execution id> <step>`` to $PLAITA_DEMO_FLOW_LOG (one
O_APPEND write each), so the tally counts step runs beyond one per step exactly: at-least-once
per step means the step running at the kill (or while the freeze cost the lease) runs again;
checkpointed steps never do. ``--flows plaita.cli.demo_flows`` loads ``FLOWS``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from plaita.cli.demo_parts import WORKER_DRAIN_S, DemoError, WorkerProcess, delete_or_say
from plaita.flows import Flow, StepContext
from plaita.store.client import make_client
from plaita.store.errors import is_redis_failure
from plaita.store.queue_access import remove_members

if TYPE_CHECKING:
    from plaita.store.streams.queue import StreamQueue

#: Environment variable naming the step-run log.
FLOW_LOG_ENV = "PLAITA_DEMO_FLOW_LOG"
#: Executions the demo starts.
EXECUTIONS = 12
#: How long the last step works (on the event loop): long enough for the kill to land in it.
SHIP_S = 0.5
#: The demo resumes one suspended execution per this many seconds, so resumes span the freeze.
RESUME_EVERY_S = 0.3
#: A short lease: the restarted worker takes the killed one's executions over within seconds.
LEASE_TTL_S = 3
#: Socket timeout of the demo's own flow calls: a stuck call must not stall the progress line.
CLIENT_TIMEOUT_S = 1.0
#: Execution states are polled this often.
POLL_S = 0.2
#: Every step run of a good execution, in order (the suspending step runs again when resumed).
EXPECTED_RUNS = ("reserve", "pay:wait", "pay:resumed", "ship")

order = Flow("demo_order")


def _log_run(ctx: StepContext, what: str) -> None:
    line = f"{time.monotonic():.6f} {ctx.execution_id} {what}\n"
    fd = os.open(os.environ[FLOW_LOG_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode("utf-8"))
    finally:
        os.close(fd)


@order.step
def reserve(ctx: StepContext) -> dict[str, Any]:
    _log_run(ctx, "reserve")
    return {"reserved": ctx.params["n"]}


@order.step
def pay(ctx: StepContext) -> Any:
    if ctx.resume is None:
        _log_run(ctx, "pay:wait")
        return ctx.suspend()  # no thread and no lease while it waits for the payment event
    _log_run(ctx, "pay:resumed")
    return {"paid": ctx.resume.data}


@order.step
async def ship(ctx: StepContext) -> dict[str, Any]:
    _log_run(ctx, "ship")
    await asyncio.sleep(SHIP_S)
    return {"shipped": True}


FLOWS = [order]


def read_log(path: Path) -> list[tuple[float, str, str]]:
    """Every step run as (monotonic time, execution id, step), from whole lines of the log."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return []
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3:
            out.append((float(parts[0]), parts[1], parts[2]))
    return out


def count_runs(log: list[tuple[float, str, str]]) -> collections.Counter[tuple[str, str]]:
    """(execution id, step) -> runs."""
    return collections.Counter((eid, step) for _t, eid, step in log)


class FlowDemo:
    """Drives the flow part from the demo's main loop (``tick``), never blocking it for long."""

    def __init__(self, directory: Path, token: str, say: Callable[[str], None]) -> None:
        self.dir = directory
        self.say = say
        self.stream = f"plaita:demo:{token}:flows"
        self.consumer = f"demo-{token}-flows"
        self.ids = [f"demo-{token}-order-{i}" for i in range(EXECUTIONS)]
        self.log_path = directory / "flow-steps.log"
        self.status_path = directory / "flow-worker-status.json"
        self.stderr_path = directory / "flow-worker.log"
        self.url = ""
        #: The demo's own queue handle: its client serves the FlowClient and the cleanup.
        self.queue: StreamQueue | None = None
        self.flows: Any = None  # a FlowClient
        self.worker: WorkerProcess | None = None
        self.docs: dict[str, dict[str, Any]] = {}
        self.resumed: set[str] = set()
        #: Registry entries of the flow workers (a killed one's stays until its TTL: deleted).
        self.instance_ids: set[str] = set()
        self.unexpected_exits: list[int] = []
        self.killed_at: float | None = None
        #: The executions whose step the kill cut (their recovery time is reported).
        self.victims: list[str] = []
        self.kill_note = "not done (every execution ended before the kill point)"
        self.recovered_s: float | None = None
        self._next_poll = self._next_resume = 0.0

    # -- setup --------------------------------------------------------------------------
    def start(self, url: str) -> None:
        from plaita.flows.producer.client import FlowClient
        from plaita.store.streams.queue import StreamQueue

        self.url = url
        client = make_client(url, socket_timeout_s=CLIENT_TIMEOUT_S)
        self.queue = StreamQueue(client, stream=self.stream, group="", consumer="", dlq_key="", dlq_max_len=1)
        self.flows = FlowClient(self.queue)
        self.start_worker()

    def start_worker(self) -> None:
        self.status_path.unlink(missing_ok=True)
        args = [
            sys.executable, "-m", "plaita", "--log-level", "WARNING", "worker",
            "--redis-url", self.url, "--queue-name", self.stream, "--consumer-name", self.consumer,
            "--flows", "plaita.cli.demo_flows", "--concurrency", str(EXECUTIONS),
            "--lease-ttl-seconds", str(LEASE_TTL_S), "--claim-min-idle-ms", "1000", "--reclaim-interval-s", "0.5",
            "--drain-timeout-s", str(WORKER_DRAIN_S), "--status-file", str(self.status_path),
        ]  # fmt: skip
        self.worker = WorkerProcess(args, {**os.environ, FLOW_LOG_ENV: str(self.log_path)}, self.stderr_path)

    def enqueue(self) -> None:
        for i, eid in enumerate(self.ids):
            self.flows.start(order.flow_id, {"n": i}, execution_id=eid)

    # -- the run ------------------------------------------------------------------------
    @property
    def completed(self) -> int:
        return sum(d.get("status") == "completed" for d in self.docs.values())

    def done(self) -> bool:
        ended = ("completed", "error", "cancelled")
        return len(self.docs) == len(self.ids) and all(d.get("status") in ended for d in self.docs.values())

    def summary(self) -> str:
        return f"{self.completed}/{len(self.ids)}"

    def tick(self, *, may_kill: bool) -> None:
        """One step of the flow part; call it only while Redis is not frozen."""
        self.check_worker()
        now = time.monotonic()
        try:
            if now >= self._next_poll:
                self._next_poll = now + POLL_S
                self.poll()
            if now >= self._next_resume and self.resume_one():
                self._next_resume = now + RESUME_EVERY_S
        except Exception as exc:
            if not is_redis_failure(exc):
                raise
            return  # Redis is coming back from the freeze: the next tick tries again
        if may_kill and self.killed_at is None:
            self.maybe_kill()
        victims = [self.docs.get(e, {}).get("status") for e in self.victims]
        if self.killed_at is not None and self.recovered_s is None and all(v == "completed" for v in victims):
            self.recovered_s = time.monotonic() - self.killed_at

    def poll(self) -> None:
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):  # not written yet, or mid-write
            self.instance_ids.add(str(json.loads(self.status_path.read_text(encoding="utf-8"))["instance_id"]))
        for eid in self.ids:
            doc = self.flows.get(eid)
            if doc is not None:
                self.docs[eid] = doc

    def resume_one(self) -> bool:
        """Resume one suspended execution with its payment data; True if one was."""
        for eid in self.ids:
            doc = self.docs.get(eid)
            if eid not in self.resumed and doc is not None and doc.get("status") == "suspended":
                # resume_id: a resume sent twice (say, retried across the freeze) applies once.
                self.flows.resume(eid, "event", {"amount": 10 * (self.ids.index(eid) + 1)}, resume_id=f"pay-{eid}")
                self.resumed.add(eid)
                return True
        return False

    def maybe_kill(self) -> None:
        """kill -9 the flow worker while an execution's last step runs, then restart it."""
        # A ship logged less than half its run time ago is surely still running.
        recent_s = time.monotonic() - SHIP_S / 2
        shipping = sorted({e for t, e, step in read_log(self.log_path) if step == "ship" and t > recent_s})
        if not shipping or self.worker is None:
            return
        self.victims = shipping
        self.worker.proc.kill()
        self.worker.proc.wait(5)
        self.worker.close()
        self.killed_at = time.monotonic()
        self.kill_note = (
            f"SIGKILL at {self.completed}/{len(self.ids)} completed, during step ship of {len(shipping)} execution(s)"
        )
        self.say(f"-- flows {self.summary()} completed: kill -9 of the flow worker; restarting it")
        self.start_worker()

    def check_worker(self) -> None:
        if self.worker is None or self.worker.exited() is None:
            return
        code = self.worker.exited()
        assert code is not None
        self.unexpected_exits.append(code)
        self.say(f"!! the flow worker exited on its own with code {code}")
        self.worker.close()
        if len(self.unexpected_exits) > 3:
            raise DemoError("the flow worker keeps exiting; giving up")
        self.start_worker()

    def stop(self) -> int | None:
        """SIGTERM the flow worker; its exit code (None if it had already exited on its own)."""
        if self.worker is None:
            return None
        if self.worker.exited() is not None:
            self.unexpected_exits.append(self.worker.exited() or 0)
            self.worker.close()
            self.worker = None
            return None
        code, _seconds = self.worker.stop(WORKER_DRAIN_S + 5)
        self.worker.close()
        self.worker = None
        return code

    # -- the tally ----------------------------------------------------------------------
    def tally(self, stop_code: int | None) -> tuple[list[tuple[str, str]], bool]:
        """Rows for the demo's tally, and whether the flow part passed."""
        runs = count_runs(read_log(self.log_path))
        good = [e for e in self.ids if self._good(e)]
        lost = len(self.ids) - len(good)
        extra = collections.Counter({step: 0 for step in EXPECTED_RUNS})
        for (_eid, step), n in runs.items():
            extra[step] += max(0, n - 1)
        rerun = sum(extra.values())
        detail = ", ".join(f"{step} {n}" for step, n in extra.items())
        recovery = "" if self.recovered_s is None else f"; all of them completed {self.recovered_s:.2f} s later"
        rows = [
            ("flow executions", f"{len(self.ids)} started, {len(good)} completed with their resume data"),
            ("flow lost", str(lost)),
            ("steps re-run", f"{rerun} ({detail}; the step cut by the kill or the freeze runs again)"),
            ("flow worker", f"kill -9: {self.kill_note}{recovery}"),
            ("flow exits", f"{len(self.unexpected_exits)} unexpected; final SIGTERM -> exit {stop_code}"),
        ]
        return rows, lost == 0 and not self.unexpected_exits and stop_code == 0

    def _good(self, eid: str) -> bool:
        doc = self.docs.get(eid) or {}
        state = doc.get("state") or {}
        paid = state.get("paid") if isinstance(state, dict) else None
        return doc.get("status") == "completed" and isinstance(paid, dict) and paid.get("amount") is not None

    # -- cleanup ------------------------------------------------------------------------
    def cleanup(self, *, delete: bool) -> None:
        """Stop the worker; with ``delete`` remove this run's keys (a server the demo does not own)."""
        if self.worker is not None:
            self.worker.close()
            self.worker = None
        if self.queue is None:
            return
        if delete:
            self._delete_keys()
        self.queue.close()
        self.queue = None

    def _delete_keys(self) -> None:
        from plaita.store.executions.store import ALL_STATUSES, DEADLINES_KEY
        from plaita.store.fleet import registry_key
        from plaita.store.keyspace import DEFAULT

        assert self.queue is not None
        keys = [self.stream, f"{self.stream}:dlq", *(registry_key(i) for i in self.instance_ids)]
        for eid in self.ids:
            keys += [
                DEFAULT.execution_key(eid),
                DEFAULT.cancel_key(eid),
                DEFAULT.lease_key(eid),
                DEFAULT.fence_key(eid),
            ]
        if not delete_or_say(self.queue, keys, self.say):
            return
        try:  # the status indexes are shared with every other flow: remove only this run's ids
            indexes = [*(DEFAULT.status_key(0, s) for s in ALL_STATUSES), DEADLINES_KEY]
            remove_members(self.queue, indexes, self.ids)
        except Exception as exc:
            if not is_redis_failure(exc):
                raise
            self.say(f"!! could not clean the execution indexes ({type(exc).__name__}: {exc})")
