"""``plaita executions`` and ``plaita keeper`` as a user runs them (subprocesses, real Redis)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.flows import flowdefs
from tests.support.lease_workers import QUEUE, ROOT, wait_for, worker_env, worker_proc

pytestmark = pytest.mark.redis

FLOW_ARGS = ("--flows", "tests.flows.flowdefs", "--read-block-ms", "200")


def plaita(url: str, *args: str, timeout_s: float = 30) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "plaita", "--quiet", *args[:1], "--redis-url", url, "--queue-name", QUEUE, *args[1:]]
    return subprocess.run(cmd, cwd=ROOT, env=worker_env(url), capture_output=True, text=True, timeout=timeout_s)


def test_start_wait_show_list_resume_cancel(redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLAITA_TEST_REDIS_URL", redis_url)
    with worker_proc(redis_url, tmp_path, "cli-w", *FLOW_ARGS) as w:
        w.wait_reading()
        r = plaita(
            redis_url, "executions", "start", "ledger3", "--input", "{}", "--execution-id", "c1", "--wait", "--json"
        )
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["status"] == "completed"
        r = plaita(redis_url, "executions", "start", "signup", "--input", '{"name": "cy"}', "--execution-id", "c2")
        assert r.returncode == 0 and r.stdout.strip() == "c2"
        wait_for(
            lambda: flowdefs.client().zscore("plaita:executions:status:suspended", "c2") is not None, 10, "c2 suspended"
        )
        r = plaita(redis_url, "executions", "resume", "c2", "--data", '"cy@example.org"')
        assert r.returncode == 0, r.stderr
        wait_for(
            lambda: flowdefs.client().zscore("plaita:executions:status:completed", "c2") is not None, 10, "c2 completed"
        )
        plaita(redis_url, "executions", "start", "signup", "--execution-id", "c3")
        wait_for(
            lambda: flowdefs.client().zscore("plaita:executions:status:suspended", "c3") is not None, 10, "c3 suspended"
        )
        r = plaita(redis_url, "executions", "cancel", "c3")
        assert r.returncode == 0 and "cancel recorded" in r.stdout and "is suspended" in r.stdout, r.stdout
        wait_for(
            lambda: flowdefs.client().zscore("plaita:executions:status:cancelled", "c3") is not None, 10, "c3 cancelled"
        )
    r = plaita(redis_url, "executions", "show", "c2")
    assert r.returncode == 0 and "status completed" in r.stdout and "wait_email" in r.stdout
    assert "cy@example.org" in r.stdout
    r = plaita(redis_url, "executions", "list", "--json")
    rows = {d["execution_id"]: d["status"] for d in json.loads(r.stdout)}
    assert rows == {"c1": "completed", "c2": "completed", "c3": "cancelled"}
    r = plaita(redis_url, "executions", "list", "--status", "completed", "--flow", "signup")
    assert "c2" in r.stdout and "c1" not in r.stdout


def test_unknown_id_and_bad_arguments(redis_url: str) -> None:
    for args in (("executions", "show", "nope"), ("executions", "cancel", "nope"), ("executions", "resume", "nope")):
        r = plaita(redis_url, *args)
        assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1 and "nope" in r.stderr, r.stderr
    r = plaita(redis_url, "executions", "start", "ledger3", "--input", "[1")
    assert r.returncode == 2 and "--input" in r.stderr and "Traceback" not in r.stderr
    r = plaita(redis_url, "keeper", "--interval-s", "-1", "--once")
    assert r.returncode == 2 and "Traceback" not in r.stderr


def test_keeper_once_and_bad_flows_module(redis_url: str) -> None:
    r = plaita(redis_url, "keeper", "--once", "--dry-run")
    assert r.returncode == 0, r.stderr
    r = subprocess.run(
        [sys.executable, "-m", "plaita", "worker", "--redis-url", redis_url, "--flows", "no.such.module"],
        cwd=ROOT, env=worker_env(redis_url), capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert r.returncode == 2 and "cannot import" in r.stderr and "Traceback" not in r.stderr
