"""Issue 31.10, the probe's papercuts: non-finite timeouts refused, expected bad input as one line
(no traceback), a closed stdout ends quietly, an ended execution is not shown as waiting."""

from __future__ import annotations

import math
import subprocess
import sys
import time

import pytest
import redis

from plaita.cli.admin import _cut, _runs
from plaita.cli.common import redis_failed
from plaita.cli.main import build_parser
from plaita.cli.options import settings_from_args
from plaita.flows.producer.client import FlowClient
from tests.cli.test_executions_cli import ROOT, one_line, put, run

pytestmark = pytest.mark.redis


@pytest.mark.parametrize("timeout_s", [math.nan, math.inf, -1.0])
def test_wait_refuses_a_timeout_that_would_never_end(redis_url: str, timeout_s: float) -> None:
    with FlowClient.from_url(redis_url) as flows, pytest.raises(ValueError, match="timeout_s"):
        flows.wait("some-id", timeout_s)


@pytest.mark.parametrize("bad_id", [None, "", 7])
def test_get_and_wait_refuse_an_id_that_is_no_id(redis_url: str, bad_id: object) -> None:
    with FlowClient.from_url(redis_url) as flows:
        with pytest.raises(ValueError, match="execution_id"):
            flows.get(bad_id)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="execution_id"):
            flows.wait(bad_id, 1.0)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (("executions", "start", "signup", "--wait", "--timeout-s", "nan"), "--timeout-s"),
        (("executions", "start", "signup", "--input", '{"a": NaN}'), "not strict JSON"),
        (("enqueue", "[1]"), "not a JSON object"),
        (("enqueue", '{"type": 7}'), "unknown task type"),
    ],
    ids=["timeout-nan", "input-nan", "enqueue-non-object", "enqueue-unknown-type"],
)
def test_bad_input_is_one_line_and_exit_2(redis_url: str, argv: tuple[str, ...], needle: str) -> None:
    r = run(*argv, "--redis-url", redis_url)
    assert r.returncode == 2 and needle in one_line(r)


def test_an_ended_execution_is_never_shown_as_waiting(redis_url: str, rclient: redis.Redis) -> None:
    for status, kind in (("cancelled", "resume"), ("completed", "sleep")):
        eid = f"ended-{kind}"
        suspension = {"kind": kind, "step": "s", "since": time.time(), "deadline": time.time() + 60}
        put(rclient, eid, status, suspension=suspension)
        r = run("executions", "show", eid, "--redis-url", redis_url)
        assert r.returncode == 0, r.stderr
        assert "suspended in" not in r.stdout and "sleeping" not in r.stdout, r.stdout


def test_a_closed_stdout_ends_quietly_not_as_a_redis_failure(redis_url: str, rclient: redis.Redis) -> None:
    for i in range(400):
        put(rclient, f"row-{i:05d}", "completed", state={"pad": "x" * 400})
    cmd = [sys.executable, "-m", "plaita", "executions", "list", "--status", "completed", "--count", "400", "--json"]
    proc = subprocess.Popen(
        [*cmd, "--redis-url", redis_url], cwd=str(ROOT), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.readline()
    proc.stdout.close()  # the reader left, as `| head -1` does
    err = proc.stderr.read().decode()
    proc.stderr.close()
    assert proc.wait(30) == 0 and "failed" not in err and "Traceback" not in err, err
    with pytest.raises(BrokenPipeError):
        redis_failed("executions", redis_url, BrokenPipeError(32, "Broken pipe"))


def test_metrics_bind_loopback_unless_the_operator_opens_them() -> None:
    """Issue 34 item 4: ``--metrics-port`` bound 0.0.0.0 by default, publishing a worker's and a
    keeper's metrics to the whole network; loopback is the default now, 0.0.0.0 a choice."""
    parser = build_parser({})
    worker = parser.parse_args(["worker", "--handler", "m:f", "--metrics-port", "9464"])
    assert settings_from_args(worker).metrics_host == "127.0.0.1"
    assert parser.parse_args(["keeper", "--metrics-port", "9101"]).metrics_host == "127.0.0.1"
    opened = parser.parse_args(["worker", "--handler", "m:f", "--metrics-port", "1", "--metrics-host", "0.0.0.0"])
    assert settings_from_args(opened).metrics_host == "0.0.0.0"
    env = build_parser({"PLAITA_METRICS_HOST": "10.0.0.5"}).parse_args(["worker", "--handler", "m:f"])
    assert settings_from_args(env).metrics_host == "10.0.0.5"


def test_workers_names_flows_without_none_and_cuts_only_without_wide() -> None:
    """Issue 34 item 4: ``plaita workers`` printed ``signup@None`` for a flow with no version and
    cut names at 40 characters with nothing to say so; ``--wide`` prints them whole."""
    entry = {"runs": {"flows": [{"flow_id": "signup", "version": None}, {"flow_id": "orders", "version": "2"}]}}
    assert _runs(entry) == "flows signup,orders@2"
    long_name = "flows " + "x" * 60
    assert _cut(long_name, 40, wide=False) == long_name[:39] + "…" and _cut(long_name, 40, wide=True) == long_name
    assert _cut("short", 40, wide=False) == "short"
    assert build_parser({}).parse_args(["workers", "--wide"]).wide is True
