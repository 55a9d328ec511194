"""Issue 10, reproductions 8 and 10: OOM, control of an unregistered worker, hostile control
messages, the admin CLI's rough edges, and what the DLQ keeps of an entry.

Real ``plaita worker`` subprocesses (or in-process Workers) on private redis-servers.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.support.ops import DLQ, QUEUE, OpsWorker, clean_env, enqueue, ops_worker, plaita, task, wait_until
from tests.support.redis_server import RedisServer
from tests.support.workers import running_worker, wait_for

pytestmark = pytest.mark.redis


def control_channel(instance_id: str) -> str:
    """The per-instance control channel (literal: operators and other tools rely on the name)."""
    return f"plaita:control:{instance_id}"


ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def out_of_memory(server: RedisServer) -> Iterator[redis.Redis]:
    """Make every write to ``server`` fail with OOM (maxmemory 1mb, noeviction), as in the issue."""
    admin = server.client()
    try:
        admin.config_set("maxmemory-policy", "noeviction")
        admin.set("hostile:filler", b"x" * (2 * 1024 * 1024))
        admin.config_set("maxmemory", "1mb")
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            admin.set("hostile:probe", "1")
        yield admin
    finally:
        admin.config_set("maxmemory", "0")
        admin.close()


def _expired_oom_worker(server: RedisServer, w: OpsWorker, admin: redis.Redis) -> None:
    """Wait until the OOM'd worker's registry entry expired (its heartbeats are refused)."""
    wait_until(lambda: admin.exists(f"plaita:registry:flow_worker:{w.instance_id}") == 0, 10, "registry expiry")


def test_control_reaches_a_worker_whose_registry_entry_expired(tmp_path: Path) -> None:
    """Reproduction 8: `plaita pause INSTANCE` answered "unknown worker instance" although the worker listened."""
    with RedisServer(persist=False) as server, ops_worker(server.url, tmp_path) as w, out_of_memory(server) as admin:
        _expired_oom_worker(server, w, admin)
        done = plaita(server.url, "pause", w.instance_id)
        assert done.returncode == 0, done.stderr
        assert "unknown worker instance" not in done.stderr
        w.wait_state("PAUSED", 10)


def test_oom_is_logged_as_out_of_memory(tmp_path: Path) -> None:
    """Reproduction 8: after pause + resume under OOM the refusal names maxmemory, not credentials."""
    with RedisServer(persist=False) as server, ops_worker(server.url, tmp_path) as w, out_of_memory(server):
        assert plaita(server.url, "pause", w.instance_id).returncode == 0
        w.wait_state("PAUSED", 10)
        assert plaita(server.url, "resume", w.instance_id).returncode == 0

        def refused_line() -> str | None:
            return next((ln for ln in w.stderr().splitlines() if "Redis refused" in ln or "OOM" in ln), None)

        line = wait_until(refused_line, 10, "the OOM refusal in the log")
        assert "out of memory (maxmemory)" in line, line
        assert "credentials" not in line, line


def test_hostile_control_messages_are_ignored_briefly_and_the_worker_keeps_going(
    redis_url: str, rclient: redis.Redis, tmp_path: Path
) -> None:
    """Reproduction 10: a 2 MB command name (logged whole), nested JSON ("control channel unavailable
    (RecursionError)") and ``"now":"false"`` (which skipped the drain) on the control channel."""
    with ops_worker(redis_url, tmp_path) as w:
        channel = control_channel(w.instance_id)
        running = enqueue(rclient, task(1, sleep_s=1.5))
        wait_until(lambda: running in w.started_ids(), 5, "the task to start")
        for message in (
            json.dumps({"command": "x" * (2 * 1024 * 1024)}),
            '{"command":"stop","x":' + "[" * 100_000 + "]" * 100_000 + "}",
            '{"command":"stop","now":"false"}',
        ):
            assert rclient.publish(channel, message) == 1
        wait_until(lambda: w.stderr().count("ignored a control message") >= 3, 5, "three warnings")
        wait_until(lambda: running in w.done_ids(), 5, "the running task to finish (not handed back)")
        w.assert_alive()
        later = enqueue(rclient, task(2))
        wait_until(lambda: later in w.done_ids(), 5, "a later task")
        status = plaita(redis_url, "status", w.instance_id, "--json")  # the listener still answers
        assert status.returncode == 0, status.stderr
        assert w.terminate() == 0
        log = w.stderr()
    assert "control channel unavailable" not in log, log
    assert max(len(line) for line in log.splitlines()) < 1000, "a control message was logged whole"


def test_status_of_a_stopped_worker_says_it_did_not_answer(redis_url: str, tmp_path: Path) -> None:
    """Reproduction 10: `plaita status INSTANCE` of a SIGSTOPped worker blamed Redis (reply wait = socket timeout)."""
    with ops_worker(redis_url, tmp_path) as w:
        # Stopped only once it listens on its control channel: stopped before, it was "registered
        # but not listening" (a CI run), which is right for that worker but not what this tests.
        client = redis.Redis.from_url(redis_url)
        channel = f"plaita:control:{w.instance_id}"
        try:
            wait_until(lambda: dict(client.pubsub_numsub(channel)).get(channel.encode(), 0) >= 1, 10, "it listens")
        finally:
            client.close()
        os.kill(w.proc.pid, signal.SIGSTOP)
        try:
            done = plaita(redis_url, "status", w.instance_id, timeout_s=30)
        finally:
            os.kill(w.proc.pid, signal.SIGCONT)
    assert done.returncode == 1
    assert "did not answer" in done.stderr, done.stderr
    assert "Redis at" not in done.stderr, done.stderr


def _closed_stdout_run(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the CLI with a stdout pipe whose reader is gone before anything is written (`| head` that exited)."""
    argv = [sys.executable, "-m", "plaita", args[0], "--redis-url", url, "--queue-name", QUEUE, *args[1:]]
    proc = subprocess.Popen(
        argv, cwd=str(ROOT), env=clean_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read().decode("utf-8", "replace")
    rc = proc.wait(20)
    proc.stderr.close()
    return subprocess.CompletedProcess(argv, rc, "", err)


@pytest.mark.parametrize(
    "args",
    [pytest.param(("status",), id="status"), pytest.param(("dlq", "list", "--json"), id="dlq-list-json")],
)
def test_closed_stdout_ends_quietly(args: tuple[str, ...], redis_url: str, rclient: redis.Redis) -> None:
    """Reproduction 10: `plaita status | head`, `plaita dlq list --json | head -c 100`: BrokenPipeError traceback."""
    for i in range(200):
        rclient.xadd(DLQ, {"payload": json.dumps({"reason": "r", "payload": {"n": i, "pad": "p" * 200}})})
    done = _closed_stdout_run(redis_url, *args)
    assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr, done.stderr
    assert done.returncode == 0, done.stderr


STREAM = "plaita:test:queue"


def _envelope_by_source(rclient: redis.Redis, source_id: str) -> dict[str, Any]:
    for _id, fields in rclient.xrange(f"{STREAM}:dlq"):
        env: dict[str, Any] = json.loads(fields["payload"])
        if env["source_id"] == source_id:
            return env
    raise AssertionError(f"{source_id} not in the DLQ")


def test_dlq_keeps_the_entry_exactly(redis_url: str, rclient: redis.Redis) -> None:
    """Reproduction 10: an entry without payload, a binary payload and a 5 MB payload in the DLQ."""
    raw = redis.Redis.from_url(redis_url, socket_timeout=10)
    binary = b"\xff\x00\xfe not text"
    huge = b"h" * (5 * 1024 * 1024)
    try:
        with running_worker(redis_url) as rw:
            no_payload = raw.xadd(STREAM, {b"body": b"{}", b"origin": b"cron"}).decode()
            binary_id = raw.xadd(STREAM, {b"payload": binary}).decode()
            huge_id = raw.xadd(STREAM, {b"payload": huge}).decode()
            wait_for(lambda: rclient.xlen(f"{STREAM}:dlq") == 3, 10.0, "three dead letters")
            assert rw.alive
    finally:
        raw.close()
    assert _envelope_by_source(rclient, no_payload)["fields"] == [["body", "{}"], ["origin", "cron"]]
    assert _envelope_by_source(rclient, binary_id)["payload"] == {"base64": base64.b64encode(binary).decode()}
    marker = _envelope_by_source(rclient, huge_id)["payload"]
    assert marker["truncated"] is True and marker["size"] == len(huge)
    assert marker["sha256"] == hashlib.sha256(huge).hexdigest()
    assert sum(len(f["payload"]) for _id, f in rclient.xrange(f"{STREAM}:dlq")) < 256 * 1024
