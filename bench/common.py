"""Shared pieces: payloads, bulk enqueue, worker subprocesses that are always cleaned up."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

#: Entries per XADD pipeline when pre-enqueueing.
ENQUEUE_CHUNK = 1000
#: Longest wait for a worker subprocess to reach a state (python start-up included).
WORKER_START_TIMEOUT_S = 20.0


def body(i: int) -> dict[str, Any]:
    """The task body every benchmark uses (same shape as ``plaita enqueue``)."""
    return {"type": "start", "flow_id": "bench", "params": {"n": i}}


def fields(i: int) -> dict[str, str]:
    """Stream entry fields exactly as plaita writes them."""
    return {"payload": json.dumps(body(i), separators=(",", ":")), "schema_version": "1"}


def enqueue(client: redis.Redis, stream: str, count: int, *, start: int = 0) -> None:
    """XADD ``count`` tasks in pipelines of ENQUEUE_CHUNK."""
    for lo in range(start, start + count, ENQUEUE_CHUNK):
        pipe = client.pipeline(transaction=False)
        for i in range(lo, min(lo + ENQUEUE_CHUNK, start + count)):
            pipe.xadd(stream, fields(i))  # type: ignore[arg-type]
        pipe.execute()


def group_pending(client: redis.Redis, stream: str, group: str) -> int:
    """PEL size of ``group`` on ``stream`` (0 when the group does not exist yet)."""
    try:
        groups = client.xinfo_groups(stream)
    except redis.ResponseError:
        return 0
    for g in groups:
        name = g.get("name")
        if (name.decode() if isinstance(name, bytes) else name) == group:
            return int(g.get("pending") or 0)
    return 0


class WorkerProcess:
    """``python -m plaita worker`` as a subprocess with a status file; ``close()`` always reaps it."""

    def __init__(
        self,
        redis_url: str,
        *,
        stream: str,
        group: str,
        handler: str = "plaita.handlers:noop",
        extra_args: list[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="plaita-bench-worker-"))
        self.status_path = self.dir / "status.json"
        self.stderr_path = self.dir / "stderr.log"
        args = [
            sys.executable, "-m", "plaita", "--log-level", "WARNING", "worker",
            "--redis-url", redis_url, "--queue-name", stream, "--consumer-group", group,
            "--consumer-name", f"bench-{os.getpid()}-{time.monotonic_ns()}",
            "--handler", handler, "--status-file", str(self.status_path),
            *(extra_args or []),
        ]  # fmt: skip
        full_env = dict(os.environ)
        full_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), full_env.get("PYTHONPATH", "")) if p)
        full_env.update(env or {})
        self._stderr = open(self.stderr_path, "wb")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=self._stderr, env=full_env, cwd=ROOT)

    def status(self) -> dict[str, Any] | None:
        try:
            return json.loads(self.status_path.read_text(encoding="utf-8"))  # type: ignore[no-any-return]
        except (OSError, ValueError):
            return None

    def state(self) -> str | None:
        st = self.status()
        return None if st is None else str(st.get("state"))

    def wait_state(self, state: str, timeout_s: float = WORKER_START_TIMEOUT_S, poll_s: float = 0.005) -> None:
        """Poll the status file until the worker reports ``state``; RuntimeError on exit or deadline."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker exited with {self.proc.returncode} before {state}: {self.stderr_tail()}")
            if self.state() == state:
                return
            time.sleep(poll_s)
        raise RuntimeError(f"worker not {state} after {timeout_s} s (last {self.state()}): {self.stderr_tail()}")

    def stderr_tail(self, chars: int = 800) -> str:
        try:
            return self.stderr_path.read_text(encoding="utf-8", errors="replace")[-chars:]
        except OSError:
            return ""

    def terminate(self, timeout_s: float = 10.0) -> int:
        """SIGTERM and wait; SIGKILL past ``timeout_s``. Returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return int(self.proc.returncode)

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(5)
        finally:
            self._stderr.close()
            for p in self.dir.iterdir():
                p.unlink(missing_ok=True)
            self.dir.rmdir()

    def __enter__(self) -> WorkerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
