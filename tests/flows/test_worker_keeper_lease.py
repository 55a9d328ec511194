"""``plaita worker --keeper --keeper-lease-ttl-s``: the keeper inside a worker has a lease of its
own length (10 s by default, not the standalone keeper's 30 s), so a kill -9 of the worker
holding it stalls sleeps, timeouts and ticks only that long: another worker's keeper takes over.
Real worker processes on a private Redis."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import redis

from plaita.cli.main import build_parser
from plaita.cli.options import settings_from_args
from plaita.config import Settings
from plaita.errors import ConfigError
from plaita.flows.producer.client import FlowClient
from plaita.ops.service import embedded_keeper_settings
from plaita.store.executions.keeper_store import keeper_lease_key
from tests.support.lease_workers import QUEUE, ROOT, wait_for, worker_proc

pytestmark = pytest.mark.redis

TTL_S = 2.0
KEEPER_LEASE_KEY = keeper_lease_key(QUEUE)  # the test queue's keeper lease
WORKER_ARGS = (
    "--flows", "tests.flows.flowdefs",
    "--flows", "tests.flows.sleepdefs",
    "--read-block-ms", "200",
    "--keeper",
    "--keeper-lease-ttl-s", str(TTL_S),
)  # fmt: skip


def parse(*argv: str) -> Settings:
    return settings_from_args(build_parser({}).parse_args(["worker", *argv]))


def test_help_names_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser({}).parse_args(["worker", "--help"])
    assert "--keeper-lease-ttl-s" in capsys.readouterr().out


def test_a_bad_flag_value_exits_2_with_one_line() -> None:
    cmd = [sys.executable, "-m", "plaita", "worker", "--flows", "tests.flows.flowdefs", "--keeper"]
    done = subprocess.run(
        [*cmd, "--keeper-lease-ttl-s", "0.5", "--redis-url", "redis://127.0.0.1:1/0"],
        cwd=str(ROOT),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "--keeper-lease-ttl-s" in lines[0], lines


def test_the_flag_sets_the_embedded_keepers_lease_and_its_passes() -> None:
    assert Settings().keeper_lease_ttl_s == 10.0
    assert parse().keeper_lease_ttl_s == 10.0
    assert parse("--keeper-lease-ttl-s", "3").keeper_lease_ttl_s == 3.0
    default = embedded_keeper_settings(Settings())
    assert (default.lease_ttl_s, default.interval_s) == (10.0, 5.0)  # the keeper's own interval
    short = embedded_keeper_settings(Settings(keeper_lease_ttl_s=3.0))
    assert (short.lease_ttl_s, short.interval_s) == (3.0, 1.5)  # passes (renewals) half a lease apart


@pytest.mark.parametrize("value", [0.5, 0.0, -1.0, float("nan"), 8 * 86400.0])
def test_a_bad_lease_is_refused(value: float) -> None:
    with pytest.raises(ConfigError, match="--keeper-lease-ttl-s"):
        Settings(keeper_lease_ttl_s=value)


def holder(client: redis.Redis) -> str:
    return (client.get(KEEPER_LEASE_KEY) or b"").decode()


def test_a_kill9_of_the_worker_holding_the_keeper_lease_hands_it_to_another(
    redis_url: str, flows: FlowClient, tmp_path: Path
) -> None:
    client = redis.Redis.from_url(redis_url, socket_timeout=5)
    try:
        with (
            worker_proc(redis_url, tmp_path, "ka", *WORKER_ARGS) as a,
            worker_proc(redis_url, tmp_path, "kb", *WORKER_ARGS) as b,
        ):
            a.wait_reading()
            b.wait_reading()
            wait_for(lambda: holder(client) != "", 15, "a keeper holding the lease")
            acting, other = (a, b) if f":{a.proc.pid}:" in holder(client) else (b, a)
            assert f":{other.proc.pid}:" not in holder(client)
            pttl_ms = int(client.pttl(KEEPER_LEASE_KEY))
            assert 0 < pttl_ms <= TTL_S * 1000  # the flag's lease, not the default 30 s
            acting.kill9()
            # Bounded well below the 30 s a default lease would take: the lease lapses after
            # TTL_S, and the other keeper tries every third of it.
            wait_for(lambda: f":{other.proc.pid}:" in holder(client), 15, "the other worker's keeper taking over")
            eid = flows.start("napper", {"sleep_s": 0.5})  # its wake needs the acting keeper
            doc = flows.wait(eid, 30)
            assert doc["status"] == "completed"
            assert other.terminate() == 0
    finally:
        client.close()
