"""A supervisor restart loop for worker subprocesses, as systemd's ``Restart=always`` runs one:
each time the worker exits it starts another (bounded in count and time), until ``done()``."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.workers import ROOT, worker_env

#: How often the loop looks at the worker and at ``done`` (polling with a deadline).
POLL_S = 0.02


@dataclass
class Supervised:
    """What the loop saw: every exit status of a worker that exited by itself, and how it ended."""

    exits: list[int] = field(default_factory=list)
    starts: int = 0
    done: bool = False
    stderr: list[str] = field(default_factory=list)

    def log(self) -> str:
        return "\n".join(f"--- start {i}\n{text[-3000:]}" for i, text in enumerate(self.stderr))


def supervise(
    url: str,
    tmp_path: Path,
    args: Sequence[str],
    done: Callable[[], bool],
    *,
    names: Sequence[str] = ("crash-host:0",),
    max_starts: int = 8,
    timeout_s: float = 90.0,
) -> Supervised:
    """Run ``python -m plaita worker ARGS`` and restart it whenever it exits, under the consumer
    names ``names`` in turn, until ``done()`` (then SIGTERM, and the worker must exit 0), at most
    ``max_starts`` starts or ``timeout_s``."""
    seen = Supervised()
    deadline = time.monotonic() + timeout_s
    while seen.starts < max_starts and time.monotonic() < deadline and not seen.done:
        name = names[seen.starts % len(names)]
        err_path = tmp_path / f"worker-{seen.starts}.stderr"
        cmd = [sys.executable, "-m", "plaita", "worker", "--redis-url", url, "--consumer-name", name, *args]
        with open(err_path, "wb") as err:
            proc = subprocess.Popen(
                cmd, cwd=str(ROOT), env=worker_env(tmp_path / "worker.log", url), stdout=subprocess.DEVNULL, stderr=err
            )
        seen.starts += 1
        try:
            _watch(proc, done, deadline, seen)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)
            seen.stderr.append(err_path.read_text(encoding="utf-8", errors="replace"))
    return seen


def _watch(proc: subprocess.Popen[bytes], done: Callable[[], bool], deadline: float, seen: Supervised) -> None:
    while time.monotonic() < deadline:
        rc = proc.poll()
        if rc is not None:
            seen.exits.append(rc)
            return
        if done():
            seen.done = True
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(15) == 0, "a worker stopped with SIGTERM exits 0"
            return
        time.sleep(POLL_S)
