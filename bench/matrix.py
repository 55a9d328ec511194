"""The chaos matrix: every Redis fault × (idle, under load, during drain), one fresh cell each.

``python -m bench.matrix`` (or ``scripts/e2e-chaos-redis.sh --matrix``). Each cell gets its own
private redis-server (appendonly, loopback, never 6379), a FaultProxy in front of it that the
worker connects through, and one ``plaita worker`` (concurrency 2, ``--drain-timeout-s``
DRAIN_TIMEOUT_S, handler ``bench.handlers:record``). The bench enqueues straight to Redis.

Faults (each ``fault_s`` long): ``freeze`` SIGSTOP/SIGCONT; ``kill-data`` kill -9, restart
with its AOF; ``kill-nodata`` kill -9, restart empty; ``blackhole`` the proxy forwards
nothing; ``resets`` the proxy resets every connection every RESET_EVERY_S.

Phases: ``idle`` the worker waits on an empty stream; recovery = Redis back → first probe
task (enqueued at that moment) completed. ``load`` LOAD_PER_S tasks/s of 10 ms run through
the fault; recovery = Redis back → first completion. ``drain`` two tasks of DRAIN_TASK_S
run, SIGTERM, the fault starts at once: the worker must exit 0 within the drain timeout + 1 s
and each task must be completed, handed back or pending.

Per cell: unexpected worker exits (it died before being told to stop, or its stop exit code
was not 0), lost tasks (the bench got an id for it, it never completed and it is not in the
stream, the PEL or the DLQ), duplicates (completions beyond one per task) and recovery time.
Tasks that were only in Redis when it restarted *without* its data are counted as wiped,
not lost: that loss is Redis's, and no worker can prevent it.

Exit code 0 when every cell has zero unexpected exits and zero lost tasks, else 1.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import redis

from bench.common import (
    LOG_ENV,
    ROOT,
    HandlerLog,
    Producer,
    Progress,
    WorkerProcess,
    client_for,
    exit_on_sigterm,
    fields,
    wait_for,
)
from tests.support.proxy import FaultProxy
from tests.support.redis_server import RedisServer

FAULTS = ("freeze", "kill-data", "kill-nodata", "blackhole", "resets")
FAULT_TITLES = {
    "freeze": "freeze (SIGSTOP)",
    "kill-data": "kill -9, restart with data",
    "kill-nodata": "kill -9, restart without data",
    "blackhole": "proxy blackhole",
    "resets": "proxy connection resets",
}
PHASES = ("idle", "load", "drain")
PHASE_TITLES = {"idle": "idle", "load": "under load", "drain": "during drain"}
STREAM = "plaita:matrix"
GROUP = "plaita-workers"
CONCURRENCY = 2
DRAIN_TIMEOUT_S = 3.0
DRAIN_TASK_S = 2.0
LOAD_PER_S = 50.0
LOAD_TASK_S = 0.01
RESET_EVERY_S = 0.5
PROBES = 5
#: Longest waits (every loop here is bounded).
STEADY_TIMEOUT_S = 20.0
RECOVERY_TIMEOUT_S = 30.0
SETTLE_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0
DOC = ROOT / "docs" / "chaos-matrix.md"


@dataclass
class Cell:
    fault: str
    phase: str
    enqueued: int = 0
    completed: int = 0
    lost: int = 0
    wiped: int = 0
    duplicates: int = 0
    pending_at_end: int = 0
    unexpected_exits: int = 0
    recovery_s: float | None = None
    stop_code: int | None = None
    stop_s: float | None = None
    notes: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.unexpected_exits == 0 and self.lost == 0

    @property
    def drain_in_time(self) -> bool:
        return self.stop_code == 0 and self.stop_s is not None and self.stop_s <= DRAIN_TIMEOUT_S + 1.0


class _Faulter:
    """Applies one fault kind to a server (or the proxy in front of it) for ``fault_s``."""

    def __init__(self, fault: str, server: RedisServer, proxy: FaultProxy, fault_s: float) -> None:
        self.fault, self.server, self.proxy, self.fault_s = fault, server, proxy, fault_s
        self.t_start = 0.0
        self.t_start_wall = 0.0
        self.t_return = 0.0

    def run(self) -> None:
        self.t_start = time.monotonic()
        self.t_start_wall = time.time()
        end = self.t_start + self.fault_s
        if self.fault == "freeze":
            self.server.freeze()
            try:
                time.sleep(self.fault_s)
            finally:
                self.server.thaw()
        elif self.fault.startswith("kill"):
            self.server.kill()
            if self.fault == "kill-nodata":
                self.server.wipe_data()
            time.sleep(self.fault_s)
            self.server.start()
        elif self.fault == "blackhole":
            self.proxy.blackhole()
            try:
                time.sleep(self.fault_s)
            finally:
                self.proxy.restore()
        else:
            while time.monotonic() < end:
                self.proxy.reset_all()
                time.sleep(min(RESET_EVERY_S, max(0.0, end - time.monotonic())))
            self.proxy.reset_all()
        self.t_return = time.monotonic()


def _decode(v: Any) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def _n_of_payload(raw: Any) -> int | None:
    try:
        body = json.loads(raw) if isinstance(raw, (str, bytes)) else raw
        if isinstance(body, dict) and isinstance(body.get("params"), dict):
            return int(body["params"]["n"])
    except (ValueError, KeyError, TypeError):
        return None
    return None


def _entries(client: redis.Redis, key: str) -> list[tuple[bytes, dict[bytes, bytes]]]:
    return cast(list[tuple[bytes, dict[bytes, bytes]]], client.xrange(key, count=100_000))


def redis_holds(client: redis.Redis, id_to_n: dict[str, int]) -> tuple[set[int], set[int], set[int]]:
    """Task numbers (n) now in the stream, in the PEL and in the DLQ."""
    stream: set[int] = set()
    for _mid, f in _entries(client, STREAM):
        n = _n_of_payload(f.get(b"payload"))
        if n is not None:
            stream.add(n)
    pel: set[int] = set()
    try:
        rows = client.xpending_range(STREAM, GROUP, min="-", max="+", count=100_000)
    except redis.ResponseError:  # no group (a restart without data before the worker came back)
        rows = []
    for r in rows:
        mid = _decode(r["message_id"])
        if mid in id_to_n:
            pel.add(id_to_n[mid])
    dlq: set[int] = set()
    for _mid, f in _entries(client, f"{STREAM}:dlq"):
        try:
            envelope = json.loads(f.get(b"payload", b"{}"))
        except ValueError:
            continue
        n = _n_of_payload(envelope.get("payload"))
        if n is None and _decode(envelope.get("source_id")) in id_to_n:
            n = id_to_n[_decode(envelope.get("source_id"))]
        if n is not None:
            dlq.add(n)
    return stream, pel, dlq


class CellRun:
    """One cell: everything it starts is stopped in ``close()``."""

    def __init__(self, fault: str, phase: str, fault_s: float) -> None:
        self.cell = Cell(fault, phase)
        self.fault_s = fault_s
        self.dir = Path(tempfile.mkdtemp(prefix="plaita-matrix-"))
        self.log = HandlerLog(self.dir / "handler.log")
        self.server = RedisServer(persist=True).start()
        self.proxy = FaultProxy(self.server.port)
        self.client = client_for(self.server.url, socket_timeout_s=60)
        self.worker: WorkerProcess | None = None
        self.producer: Producer | None = None
        self.acked: dict[int, str] = {}
        self.next_n = 0
        self.faulter = _Faulter(fault, self.server, self.proxy, fault_s)

    # -- helpers ----------------------------------------------------------------------
    def start_worker(self) -> WorkerProcess:
        self.worker = WorkerProcess(
            self.proxy.url,
            stream=STREAM,
            group=GROUP,
            consumer_name=f"matrix-{self.cell.fault}-{self.cell.phase}",
            handler="bench.handlers:record",
            extra_args=[
                "--concurrency",
                str(CONCURRENCY),
                "--drain-timeout-s",
                f"{DRAIN_TIMEOUT_S:g}",
                "--log-level",
                os.environ.get("PLAITA_MATRIX_LOG_LEVEL", "INFO"),
            ],
            env={LOG_ENV: str(self.log.path)},
        )
        self.worker.wait_state("READING")
        return self.worker

    def add(self, count: int, **params: Any) -> list[int]:
        """XADD ``count`` tasks straight to Redis (retrying for up to 10 s while it restarts)."""
        out = []
        for _ in range(count):
            n = self.next_n
            self.next_n += 1
            deadline = time.monotonic() + 10
            while True:
                try:
                    mid = self.client.xadd(STREAM, fields(n, t=time.time(), **params))  # type: ignore[arg-type]
                    break
                except redis.ConnectionError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
            self.acked[n] = _decode(mid)
            out.append(n)
        return out

    def completions(self) -> int:
        self.log.poll()
        return len(self.log.of("E"))

    def first_completion_after(self, t: float) -> float | None:
        self.log.poll()
        times = [e.mono for e in self.log.events if e.kind == "E" and e.mono > t]
        return min(times) if times else None

    def check_alive(self) -> None:
        if self.worker is not None and not self.worker.alive():
            self.cell.unexpected_exits += 1
            self.cell.notes.append(f"worker exited on its own with {self.worker.proc.returncode}")
            raise RuntimeError(f"worker exited: {self.worker.stderr_tail(300)}")

    def stop_worker(self) -> None:
        assert self.worker is not None
        self.check_alive()
        t0 = time.monotonic()
        self.cell.stop_code = self.worker.terminate(STOP_TIMEOUT_S)
        self.cell.stop_s = time.monotonic() - t0
        if self.cell.stop_code != 0:
            self.cell.unexpected_exits += 1
            self.cell.notes.append(f"stop: exit code {self.cell.stop_code}")

    # -- phases -----------------------------------------------------------------------
    def run(self) -> Cell:
        try:
            getattr(self, f"_{self.cell.phase}")()
            self.account()
        except Exception as exc:  # the cell reports it; the matrix goes on
            self.cell.error = f"{type(exc).__name__}: {exc}"[:300]
            try:
                self.account()
            except Exception as exc2:
                self.cell.notes.append(f"accounting failed: {exc2}")
        if not self.cell.ok and self.worker is not None:
            self.keep_worker_log()
        return self.cell

    def keep_worker_log(self) -> None:
        """Copy a failed cell's worker log (stderr) to a temp file and name it in the notes."""
        assert self.worker is not None
        fd, path = tempfile.mkstemp(prefix=f"plaita-matrix-{self.cell.fault}-{self.cell.phase}-", suffix=".log")
        with open(fd, "w", encoding="utf-8") as f:
            f.write(self.worker.stderr_tail(1_000_000))
        self.cell.notes.append(f"worker log kept in {path}")

    def _idle(self) -> None:
        self.start_worker()
        first = set(self.add(3))
        if not wait_for(lambda: self.log.all_finished(first), 15):
            raise RuntimeError("baseline tasks not done before the fault")
        self.faulter.run()
        self.add(PROBES)
        self._recovered()
        self._settle()
        self.stop_worker()

    def _load(self) -> None:
        self.start_worker()
        self.producer = Producer(
            self.server.url,
            STREAM,
            LOAD_PER_S,
            max_s=self.fault_s + 120,
            params={"sleep_s": LOAD_TASK_S},
            socket_timeout_s=60,
        )
        self.producer.start()
        if not wait_for(lambda: self.completions() >= 20, STEADY_TIMEOUT_S):
            raise RuntimeError("worker not consuming the load before the fault")
        self.check_alive()
        self.faulter.run()
        self._recovered()
        time.sleep(2.0)
        self.producer.stop()
        self.acked.update({n: mid for n, mid in self.producer.acked.items()})
        if self.producer.uncertain:
            self.cell.notes.append(f"{len(self.producer.uncertain)} XADDs failed during the fault (not counted)")
        self._settle()
        self.stop_worker()

    def _drain(self) -> None:
        self.start_worker()
        assert self.worker is not None
        tasks = set(self.add(CONCURRENCY, sleep_s=DRAIN_TASK_S))

        def all_started() -> bool:
            self.log.poll()
            return tasks <= {e.n for e in self.log.of("S")}

        if not wait_for(all_started, 15):
            raise RuntimeError("drain tasks did not start")
        self.check_alive()
        t_term = time.monotonic()
        self.worker.proc.send_signal(signal.SIGTERM)
        fault = threading.Thread(target=self.faulter.run, name="matrix-fault", daemon=True)
        fault.start()
        try:
            self.worker.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.worker.kill9()
            self.cell.notes.append(f"still running {STOP_TIMEOUT_S:g} s after SIGTERM: killed")
        self.cell.stop_s = time.monotonic() - t_term
        self.cell.stop_code = int(self.worker.proc.returncode)
        fault.join(self.fault_s + 30)
        if self.cell.stop_code != 0:
            self.cell.unexpected_exits += 1
        if not self.cell.drain_in_time:
            self.cell.notes.append(
                f"exit {self.cell.stop_code} after {self.cell.stop_s:.2f} s "
                f"(expected 0 within {DRAIN_TIMEOUT_S + 1:g} s)"
            )
        self.server.wait_ready()

    def _recovered(self) -> None:
        t_return = self.faulter.t_return
        if not wait_for(lambda: self.first_completion_after(t_return) is not None, RECOVERY_TIMEOUT_S):
            self.check_alive()
            raise RuntimeError(f"nothing completed {RECOVERY_TIMEOUT_S:g} s after Redis returned")
        first = self.first_completion_after(t_return)
        assert first is not None
        self.cell.recovery_s = first - t_return
        self.check_alive()

    def _settle(self) -> None:
        """Wait (bounded) until every task with an id completed."""
        want = set(self.acked)
        if self.cell.fault == "kill-nodata":
            want -= self._wiped_candidates()
        wait_for(lambda: self.log.all_finished(want), SETTLE_TIMEOUT_S, 0.05)

    def _wiped_candidates(self) -> set[int]:
        """Tasks enqueued before the restart without data (stream ids are <ms since epoch>-<seq>), not completed."""
        if not self.faulter.t_start_wall:
            return set()
        before_ms = self.faulter.t_start_wall * 1000
        return {n for n, mid in self.acked.items() if int(mid.split("-")[0]) < before_ms} - self.log.finished_ns()

    # -- accounting -------------------------------------------------------------------
    def account(self) -> None:
        if self.producer is not None:
            self.producer.stop()
            self.acked.update(self.producer.acked)
        self.log.poll()
        finished = self.log.finished_ns()
        id_to_n = {mid: n for n, mid in self.acked.items()}
        in_stream, in_pel, in_dlq = redis_holds(self.client, id_to_n)
        held = in_stream | in_pel | in_dlq
        missing = set(self.acked) - finished - held
        wiped = missing & self._wiped_candidates() if self.cell.fault == "kill-nodata" else set()
        self.cell.enqueued = len(self.acked)
        self.cell.completed = len(set(self.acked) & finished)
        self.cell.wiped = len(wiped)
        self.cell.lost = len(missing - wiped)
        self.cell.duplicates = self.log.duplicates()
        self.cell.pending_at_end = len((in_stream | in_pel) - finished)

    def close(self) -> None:
        if self.producer is not None:
            self.producer.close()
        if self.worker is not None:
            self.worker.close()
        self.client.close()
        self.proxy.close()
        self.server.stop()
        self.log.path.unlink(missing_ok=True)
        self.dir.rmdir()


def run_cell(fault: str, phase: str, fault_s: float) -> Cell:
    cr = CellRun(fault, phase, fault_s)
    try:
        return cr.run()
    finally:
        cr.close()


def run(fault_s: float = 5.0, faults: tuple[str, ...] = FAULTS, phases: tuple[str, ...] = PHASES) -> list[Cell]:
    cells = []
    progress = Progress("chaos matrix", len(faults) * len(phases))
    for fault in faults:
        for phase in phases:
            cell = run_cell(fault, phase, fault_s)
            cells.append(cell)
            verdict = "ok" if cell.ok else "FAIL"
            progress.step(note=f"{fault} × {phase}: {verdict}, lost {cell.lost}, exits {cell.unexpected_exits}")
    progress.finish()
    return cells


def _recovery_text(c: Cell) -> str:
    if c.phase == "drain":
        if c.stop_s is None:
            return "–"
        return f"exit {c.stop_code} in {c.stop_s:.2f} s" + ("" if c.drain_in_time else " (late)")
    return "–" if c.recovery_s is None else f"{c.recovery_s * 1000:.0f} ms"


def render(cells: list[Cell]) -> str:
    lines = [
        "| fault | phase | unexpected exits | lost | duplicates | recovery / drain exit | enqueued | completed "
        "| pending at end | wiped with data | result |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in cells:
        notes = "; ".join(([c.error] if c.error else []) + c.notes)
        result = ("ok" if c.ok else "**FAIL**") + (f" ({notes})" if notes else "")
        lines.append(
            f"| {FAULT_TITLES[c.fault]} | {PHASE_TITLES[c.phase]} | {c.unexpected_exits} | {c.lost} | {c.duplicates} | "
            f"{_recovery_text(c)} | {c.enqueued} | {c.completed} | {c.pending_at_end} | {c.wiped} | {result} |"
        )
    failed = [c for c in cells if not c.ok]
    summary = (
        f"**{len(cells) - len(failed)}/{len(cells)} cells ok**: "
        f"{sum(c.unexpected_exits for c in cells)} unexpected worker exits, {sum(c.lost for c in cells)} lost tasks, "
        f"{sum(c.duplicates for c in cells)} duplicate executions, "
        f"{sum(c.wiped for c in cells)} tasks wiped by a restart without data."
    )
    return "\n".join([summary, "", *lines]) + "\n"


def write_doc(table: str, fault_s: float, wall_s: float, commit: str) -> None:
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    text = (
        "# Chaos matrix\n\n"
        "Generated by `scripts/e2e-chaos-redis.sh --matrix` (`.venv/bin/python -m bench.matrix`) or by a full "
        "`python -m bench`; do not edit by hand.\n\n"
        f"Run: {when} · commit `{commit}` · every fault {fault_s:g} s · whole matrix {wall_s:.0f} s\n\n"
        f"{table}\n"
        "How: each cell has its own private redis-server (appendonly, loopback) with a FaultProxy in front, "
        f"one `plaita worker` (concurrency {CONCURRENCY}, `--drain-timeout-s {DRAIN_TIMEOUT_S:g}`) connected through "
        "the proxy, tasks enqueued straight to Redis. *idle*: recovery = Redis back → first of "
        f"{PROBES} probe tasks (enqueued at that moment) completed. *under load*: {LOAD_PER_S:g} tasks/s of "
        f"{LOAD_TASK_S * 1000:g} ms through the fault, recovery = Redis back → first completion. *during drain*: "
        f"{CONCURRENCY} tasks of {DRAIN_TASK_S:g} s running, SIGTERM, the fault starts at once; expected: exit 0 "
        f"within {DRAIN_TIMEOUT_S + 1:g} s. *lost* = the bench got an id for it, it never completed and it is "
        "not in the stream, the PEL or the DLQ. *pending at end* = still in the stream or PEL after the cell, not "
        "completed (expected after a drain: handed back or left pending for the next worker). *wiped with data* = "
        "only Redis held it when Redis restarted empty. *resets* = every proxied connection reset every "
        f"{RESET_EVERY_S:g} s for the fault's duration.\n"
    )
    DOC.write_text(text, encoding="utf-8")


def git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "log", "-1", "--format=%h %s"], capture_output=True, text=True, timeout=10, cwd=ROOT
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "plaita"], capture_output=True, text=True, timeout=10, cwd=ROOT
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out + (" + uncommitted changes in plaita/" if dirty else "")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.matrix", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--fault-s", type=float, default=5.0, help="seconds each fault lasts (default 5)")
    p.add_argument("--faults", default=",".join(FAULTS), help=f"comma-separated subset of {','.join(FAULTS)}")
    p.add_argument("--phases", default=",".join(PHASES), help=f"comma-separated subset of {','.join(PHASES)}")
    p.add_argument(
        "--write", action=argparse.BooleanOptionalAction, default=True, help="write docs/chaos-matrix.md (default: yes)"
    )
    args = p.parse_args(argv)
    exit_on_sigterm()
    faults = tuple(f for f in args.faults.split(",") if f)
    phases = tuple(f for f in args.phases.split(",") if f)
    bad = [x for x in faults if x not in FAULTS] + [x for x in phases if x not in PHASES]
    if bad or not faults or not phases or not 0.5 <= args.fault_s <= 60:
        p.error(f"unknown fault/phase {bad} or --fault-s outside 0.5..60")
    started = time.monotonic()
    print(f"chaos matrix: {len(faults)} faults × {len(phases)} phases, each fault {args.fault_s:g} s", flush=True)
    cells = run(args.fault_s, faults, phases)
    wall_s = time.monotonic() - started
    table = render(cells)
    print()
    print(table)
    print(f"chaos matrix: {wall_s:.0f} s")
    if args.write and faults == FAULTS and phases == PHASES:
        write_doc(table, args.fault_s, wall_s, git_commit())
        print(f"wrote {DOC.relative_to(ROOT)}")
    return 0 if all(c.ok for c in cells) else 1


if __name__ == "__main__":
    sys.exit(main())
