"""Issue 10, reproduction 9 (and the CLI items of 10): every bad flag is refused at start with one
line on stderr and exit 2, no traceback; a worker never starts with a value it cannot use.

Each case runs ``python -m plaita worker`` against the private Redis; a worker that starts
anyway is killed after ``START_S`` and the case fails.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.redis

ROOT = Path(__file__).resolve().parents[2]
#: A worker that has not exited by then accepted the flag (bad flags exit in well under a second).
START_S = 30.0


def run_worker(redis_url: str, *args: str, pythonpath: str = "") -> tuple[int | None, str]:
    """(exit code or None if it kept running, stderr) of ``plaita worker --redis-url URL ARGS``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLAITA_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), pythonpath) if p)
    argv = [sys.executable, "-m", "plaita", "worker", "--redis-url", redis_url, "--no-registry", *args]
    if "--handler" not in args and "--flows" not in args:  # the flag under test must be what fails
        argv += ["--handler", "plaita.runtime.handlers:echo"]
    proc = subprocess.Popen(argv, cwd=str(ROOT), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _out, err = proc.communicate(timeout=START_S)
        return proc.returncode, err.decode("utf-8", "replace")
    except subprocess.TimeoutExpired:
        proc.kill()
        _out, err = proc.communicate(timeout=5)
        return None, err.decode("utf-8", "replace")


def assert_refused(rc: int | None, stderr: str, needle: str) -> None:
    assert rc is not None, f"the worker started with the bad flag:\n{stderr}"
    assert rc == 2, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    assert needle in lines[0], lines[0]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        pytest.param(["--claim-min-idle-ms", "99999999999999999999"], "--claim-min-idle-ms", id="claim-min-idle-huge"),
        pytest.param(["--consumer-prune-idle-s", "nan"], "--consumer-prune-idle-s", id="prune-idle-nan"),
        pytest.param(["--lease-ttl-seconds", "inf"], "--lease-ttl-seconds", id="lease-ttl-inf"),
        pytest.param(["--drain-timeout-s", "nan"], "--drain-timeout-s", id="drain-nan"),
        pytest.param(["--reclaim-interval-s", "inf"], "--reclaim-interval-s", id="reclaim-inf"),
        pytest.param(["--registry-ttl", "nan"], "--registry-ttl", id="registry-ttl-nan"),
        pytest.param(["--metrics-port", "70000"], "--metrics-port", id="metrics-port-over-65535"),
    ],
)
def test_out_of_range_flag_exits_2(args: list[str], needle: str, redis_url: str) -> None:
    """Reproduction 9: these were accepted (the worker then never consumed) or crashed with a traceback."""
    assert_refused(*run_worker(redis_url, *args), needle)


def test_metrics_port_in_use_exits_2(redis_url: str) -> None:
    """Reproduction 9: a --metrics-port in use was a traceback and exit 1."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        rc, stderr = run_worker(redis_url, "--metrics-port", str(port), "--metrics-host", "127.0.0.1")
    assert_refused(rc, stderr, "--metrics-port")


def test_unbindable_metrics_host_exits_2(redis_url: str) -> None:
    """Reproduction 9: an address this host does not have (TEST-NET-1) was a traceback and exit 1."""
    # --metrics-port 0 means off in the CLI; a real port is needed for the host to matter.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    rc, stderr = run_worker(redis_url, "--metrics-port", str(port), "--metrics-host", "192.0.2.1")
    assert_refused(rc, stderr, "--metrics-host")


def test_handler_module_raising_on_import_exits_2(redis_url: str, tmp_path: Path) -> None:
    (tmp_path / "hostile_handler.py").write_text('raise RuntimeError("boom at import")\n', encoding="utf-8")
    rc, stderr = run_worker(redis_url, "--handler", "hostile_handler:run", pythonpath=str(tmp_path))
    assert_refused(rc, stderr, "hostile_handler")


@pytest.mark.parametrize("other", [["--flows", "tests.flows.flowdefs"], ["--keeper"]], ids=["flows", "keeper"])
def test_handler_with_flows_or_keeper_exits_2(redis_url: str, other: list[str]) -> None:
    """Issue 31.9: ``--handler`` beside ``--flows`` was accepted, ignored, and its tasks dead-lettered."""
    rc, stderr = run_worker(redis_url, "--handler", "plaita.runtime.handlers:echo", *other)
    assert_refused(rc, stderr, "--handler cannot be combined with --flows or --keeper")


def test_unwritable_status_file_exits_2(redis_url: str, tmp_path: Path) -> None:
    rc, stderr = run_worker(redis_url, "--status-file", str(tmp_path / "no-such-dir" / "status.json"))
    assert_refused(rc, stderr, "--status-file")


def test_dlq_list_accepts_redis_url_after_the_subcommand(redis_url: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLAITA_")}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-m", "plaita", "dlq", "list", "--redis-url", redis_url],
        cwd=str(ROOT),
        env=env,
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    assert done.returncode == 0, done.stderr
