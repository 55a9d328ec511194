"""``plaita demo``: watch a worker ride out a Redis freeze, then count every execution.

Without ``--redis-url`` the demo starts a private redis-server (free loopback port, temp
dir), runs ``plaita worker`` as a subprocess (handler ``plaita.cli.demo_parts:demo_handler``,
concurrency 4), enqueues the tasks, freezes Redis with SIGSTOP once about a third are done,
thaws it after ``--freeze-s`` and prints a tally: completed, lost, duplicate executions,
unexpected worker exits, how long Redis was frozen and how long work took to resume.
With ``--redis-url`` it uses that server without freezing it, on a stream of its own
(``plaita:demo:<random>``) whose keys it deletes at the end; it never flushes anything.

Exit code: 0 when nothing was lost and the worker never exited on its own, else 1.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

from plaita.cli.demo_flows import FlowDemo
from plaita.cli.demo_parts import (
    CONCURRENCY,
    DEMO_LOG_ENV,
    MAX_FREEZE_S,
    MAX_RESTARTS,
    PLAIN_REFRESH_S,
    TASK_SLEEP_S,
    TICK_S,
    TIME_LIMIT_S,
    TTY_REFRESH_S,
    WORKER_DRAIN_S,
    WORKER_START_TIMEOUT_S,
    DemoError,
    ExecutionLog,
    Freeze,
    WorkerProcess,
    delete_or_say,
    log_tail,
    print_tally,
)
from plaita.config import redact_url, validate_redis_url
from plaita.store.client import make_client
from plaita.store.errors import is_redis_failure
from plaita.store.fleet import registry_key
from plaita.store.keyspace import DEFAULT
from plaita.store.queue_access import ping
from plaita.store.server import PrivateRedis, RedisServerError
from plaita.store.stats import is_settled
from plaita.store.streams.queue import StreamQueue


class Demo:
    """One demo run; ``cleanup()`` undoes everything it started, whatever happened."""

    def __init__(self, tasks: int, freeze_s: float, redis_url: str | None, out: TextIO) -> None:
        self.tasks = tasks
        self.freeze_s = freeze_s
        self.external_url = redis_url
        self.out = out
        self.tty = out.isatty()
        self.token = secrets.token_hex(4)
        self.stream = f"plaita:demo:{self.token}"
        self.group = "plaita-demo"
        self.consumer = f"demo-{self.token}"
        self.dir = Path(tempfile.mkdtemp(prefix="plaita-demo-"))
        self.log = ExecutionLog(self.dir / "executions.log")
        self.status_path = self.dir / "worker-status.json"
        self.stderr_path = self.dir / "worker.log"
        self.server: PrivateRedis | None = None
        self.url = ""
        self.queue: StreamQueue | None = None
        self.worker: WorkerProcess | None = None
        self.unexpected_exits: list[int] = []
        self.freeze = Freeze()
        self.instance_ids: set[str] = set()
        self.started_at = time.monotonic()
        self._last_line_len = 0
        self.flows = FlowDemo(self.dir, self.token, self.say)

    # -- output -------------------------------------------------------------------------
    def say(self, text: str) -> None:
        if self.tty and self._last_line_len:
            self.out.write("\n")
            self._last_line_len = 0
        self.out.write(text + "\n")
        self.out.flush()

    def progress(self) -> None:
        elapsed = time.monotonic() - self.started_at
        redis_text = "ok"
        if self.freeze.started_at is not None and self.freeze.ended_at is None:
            redis_text = f"FROZEN {self.freeze.seconds:4.1f}/{self.freeze_s:g} s"
        elif self.freeze.ended_at is not None:
            redis_text = f"thawed (frozen {self.freeze.seconds:.1f} s)"
        line = (
            f"[{elapsed:5.1f} s] done {self.log.unique:>{len(str(self.tasks))}}/{self.tasks}"
            f" | flows {self.flows.summary()} | worker {self.worker_state():<12} | redis {redis_text}"
        )
        if self.tty:
            pad = max(0, self._last_line_len - len(line))
            self.out.write("\r" + line + " " * pad)
            self._last_line_len = len(line)
        else:
            self.out.write(line + "\n")
        self.out.flush()

    # -- worker -------------------------------------------------------------------------
    def worker_status(self) -> dict[str, Any]:
        try:
            data = json.loads(self.status_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict):
            return {}
        if data.get("instance_id"):
            self.instance_ids.add(str(data["instance_id"]))
        return data

    def worker_state(self) -> str:
        if self.worker is not None and self.worker.exited() is not None:
            return "EXITED"
        return str(self.worker_status().get("state") or "starting")

    def start_worker(self) -> None:
        self.status_path.unlink(missing_ok=True)
        args = [
            sys.executable, "-m", "plaita", "--log-level", "WARNING", "worker",
            "--redis-url", self.url, "--queue-name", self.stream, "--consumer-group", self.group,
            "--consumer-name", self.consumer, "--handler", "plaita.cli.demo_parts:demo_handler",
            "--concurrency", str(CONCURRENCY), "--drain-timeout-s", str(WORKER_DRAIN_S),
            "--status-file", str(self.status_path),
        ]  # fmt: skip
        env = dict(os.environ)
        env[DEMO_LOG_ENV] = str(self.log.path)
        self.worker = WorkerProcess(args, env, self.stderr_path)

    def wait_reading(self, deadline: float) -> None:
        limit = min(deadline, time.monotonic() + WORKER_START_TIMEOUT_S)
        while time.monotonic() < limit:
            if self.worker is not None and self.worker.exited() is not None:
                raise DemoError(f"the worker exited with code {self.worker.exited()} while starting")
            if self.worker_state() == "READING":
                return
            time.sleep(TICK_S)
        raise DemoError(f"the worker did not reach READING within {WORKER_START_TIMEOUT_S:g} s")

    def record_exit(self) -> bool:
        """Count an exit nobody asked for; True if the worker has exited."""
        if self.worker is None or self.worker.exited() is None:
            return False
        code = self.worker.exited()
        assert code is not None
        self.unexpected_exits.append(code)
        self.say(f"!! the worker exited on its own with code {code}")
        self.worker.close()
        self.worker = None
        return True

    def check_worker(self) -> None:
        """Count an unrequested exit and restart the worker (bounded) so the run can finish."""
        if not self.record_exit():
            return
        if len(self.unexpected_exits) > MAX_RESTARTS:
            raise DemoError(f"the worker exited {len(self.unexpected_exits)} times; giving up")
        self.say("   restarting it so the tally can finish")
        self.start_worker()

    # -- redis --------------------------------------------------------------------------
    def connect(self) -> None:
        if self.external_url is None:
            self.say("starting a private redis-server on a free loopback port ...")
            self.server = PrivateRedis().start()
            self.url = self.server.url
            self.say(
                f"  redis-server {self.url} (temp dir {self.server.dir}); it will be frozen for {self.freeze_s:g} s"
            )
        else:
            validate_redis_url(self.external_url)
            self.url = self.external_url
            self.say(
                f"using Redis at {redact_url(self.url)}: NO freeze (the demo only freezes a server it started); "
                f"stream {self.stream}, deleted at the end"
            )
        self.queue = StreamQueue(
            make_client(self.url, socket_timeout_s=5.0),
            stream=self.stream,
            group=self.group,
            consumer="plaita-demo",
            dlq_key="",
            dlq_max_len=1,
        )
        try:
            ping(self.queue)
        except Exception as exc:
            if not is_redis_failure(exc):
                raise
            raise DemoError(f"Redis at {redact_url(self.url)} is not reachable: {type(exc).__name__}: {exc}") from None

    def execution_id(self, i: int) -> str:
        return f"demo-{self.token}-{i}"

    def enqueue(self) -> None:
        assert self.queue is not None
        bodies: list[dict[str, Any]] = [
            {
                "type": "start",
                "flow_id": "demo",
                "execution_id": self.execution_id(i),
                "params": {"n": i, "sleep_s": TASK_SLEEP_S},
            }
            for i in range(self.tasks)
        ]
        self.queue.enqueue_many(bodies)

    def settled(self) -> bool:
        """True when the stream is empty and nothing is pending (every ack reached Redis)."""
        assert self.queue is not None
        try:
            return is_settled(self.queue)
        except Exception as exc:
            if not is_redis_failure(exc):
                raise
            return False

    def maybe_freeze(self) -> None:
        if self.server is not None and self.freeze_s > 0:
            self.freeze.step(self.server, self.log.unique, self.tasks, self.freeze_s, self.say)

    # -- the run ------------------------------------------------------------------------
    def run(self) -> int:
        deadline = self.started_at + TIME_LIMIT_S + self.freeze_s
        self.connect()
        self.start_worker()
        self.flows.start(self.url)
        self.wait_reading(deadline)
        self.say(f"worker running (concurrency {CONCURRENCY}); enqueueing {self.tasks} tasks of {TASK_SLEEP_S:g} s")
        self.enqueue()
        self.say(f"flow worker running; starting {len(self.flows.ids)} executions of a 3-step flow that suspends")
        self.flows.enqueue()
        gave_up = self.watch(deadline)
        self.progress()
        if gave_up:
            self.say(
                f"!! gave up after {TIME_LIMIT_S + self.freeze_s:g} s: {self.log.unique}/{self.tasks} tasks "
                f"completed, worker {self.worker_state()}"
            )
        stop_code, stop_s = self.stop_worker()
        flow_rows, flows_ok = self.flows.tally(self.flows.stop())
        self.log.poll()
        return self.tally(stop_code, stop_s, gave_up, flow_rows, flows_ok)

    def watch(self, deadline: float) -> bool:
        """Drive freeze, kill and progress until every task and execution is done; True = gave up."""
        freeze_planned = self.server is not None and self.freeze_s > 0
        refresh_s = TTY_REFRESH_S if self.tty else PLAIN_REFRESH_S
        next_refresh = 0.0
        while True:
            now = time.monotonic()
            self.log.poll()
            self.check_worker()
            self.maybe_freeze()
            if now >= next_refresh:
                self.progress()
                next_refresh = now + refresh_s
            frozen = self.freeze.started_at is not None and self.freeze.ended_at is None
            if not frozen:  # the kill -9 comes after the thaw, so each fault is seen on its own
                self.flows.tick(may_kill=self.freeze.ended_at is not None or not freeze_planned)
            if not frozen and self.log.unique >= self.tasks and self.flows.done() and self.settled():
                return False
            if now >= deadline:
                return True
            time.sleep(TICK_S)

    def stop_worker(self) -> tuple[int | None, float]:
        self.record_exit()
        if self.worker is None:
            return None, 0.0
        code, seconds = self.worker.stop(WORKER_DRAIN_S + 5)
        self.worker_status()
        self.worker.close()
        self.worker = None
        return code, seconds

    def tally(
        self, stop_code: int | None, stop_s: float, gave_up: bool, flow_rows: list[tuple[str, str]], flows_ok: bool
    ) -> int:
        lost = self.tasks - self.log.unique
        duplicates = self.log.executions - self.log.unique
        rows: list[tuple[str, str]] = [
            ("tasks enqueued", str(self.tasks)),
            ("completed", f"{self.log.unique} distinct tasks ({self.log.executions} handler executions)"),
            ("lost", str(lost)),
            ("duplicates", f"{duplicates} (executions beyond one per task)"),
            ("worker exits", f"{len(self.unexpected_exits)} unexpected"
             + (f" (codes {', '.join(map(str, self.unexpected_exits))})" if self.unexpected_exits else "")),
            ("worker stop", f"SIGTERM -> exit {stop_code} in {stop_s:.2f} s"),
        ]  # fmt: skip
        rows += self.freeze.rows(self.log, self.tasks, own_server=self.server is not None)
        rows += flow_rows
        ok = lost == 0 and not self.unexpected_exits and not gave_up and stop_code == 0 and flows_ok
        rows.append(("result", "PASS: nothing lost, the workers never exited on their own" if ok else "FAIL"))
        self.print_tally(rows)
        return 0 if ok else 1

    def print_tally(self, rows: list[tuple[str, str]]) -> None:
        print_tally(rows, self.worker_log_lines(), self.say)

    def worker_log_lines(self) -> list[str]:
        return log_tail(self.stderr_path) + log_tail(self.flows.stderr_path)

    # -- cleanup ------------------------------------------------------------------------
    def cleanup(self) -> None:
        """Stop the worker, thaw and stop the private server, delete demo keys, remove the temp dir."""
        if self.server is not None:
            self.server.thaw()
        if self.worker is not None:
            with contextlib.suppress(Exception):
                self.worker.stop(WORKER_DRAIN_S + 5)
            self.worker.close()
            self.worker = None
        self.flows.cleanup(delete=self.server is None)
        if self.queue is not None:
            if self.server is None:
                self.delete_demo_keys()
            self.queue.close()
            self.queue = None
        if self.server is not None:
            self.server.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def delete_demo_keys(self) -> None:
        """On a server the demo does not own: delete exactly the keys this run created."""
        assert self.queue is not None
        self.worker_status()
        keys = [self.stream, f"{self.stream}:dlq", *(registry_key(i) for i in self.instance_ids)]
        for i in range(self.tasks):
            keys += [DEFAULT.lease_key(self.execution_id(i)), DEFAULT.fence_key(self.execution_id(i))]
        delete_or_say(self.queue, keys, self.say)


def _interrupt(_signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def run_demo(args: argparse.Namespace) -> int:
    """Entry point of ``plaita demo`` (``args.redis_url``, ``args.tasks``, ``args.freeze_s``)."""
    tasks = int(args.tasks)
    freeze_s = float(args.freeze_s)
    if not 1 <= tasks <= 100_000:
        print("plaita demo: error: --tasks must be within 1..100000", file=sys.stderr)
        return 2
    if not 0 <= freeze_s <= MAX_FREEZE_S:
        print(f"plaita demo: error: --freeze-s must be within 0..{MAX_FREEZE_S:g}", file=sys.stderr)
        return 2
    redis_url = str(args.redis_url) if args.redis_url else None
    if redis_url is not None:
        validate_redis_url(redis_url)  # ConfigError -> exit 2 in cli.main
    on_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _interrupt) if on_main else None
    demo: Demo | None = None
    try:
        demo = Demo(tasks, freeze_s, redis_url, sys.stdout)
        return demo.run()
    except DemoError as exc:
        print(f"\nplaita demo: {exc}", file=sys.stderr)
        if demo is not None:
            for line in demo.worker_log_lines():
                print(f"  worker: {line}", file=sys.stderr)
        return 1
    except RedisServerError as exc:
        print(f"plaita demo: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nplaita demo: interrupted; stopping the worker and Redis and removing temp files", file=sys.stderr)
        return 130
    finally:
        if demo is not None:
            demo.cleanup()
        if on_main and previous is not None:
            signal.signal(signal.SIGTERM, previous)
