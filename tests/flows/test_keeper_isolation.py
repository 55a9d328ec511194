"""The keeper isolates every schedule and every key (issue 29, item 2): a cron that never fires is
refused when its flow is defined (exit 2, one line naming the flow); a bad schedule met at run time
(one that cannot be stepped, or a bad one recorded in Redis) is skipped with one error line while
the rest of the pass goes on; a wrong-typed index of one tenant never stops another tenant's
wake-ups, nor the rest of the pass; ``schedules list`` and the dashboard show a bad schedule as an
error row. Real redis-servers."""

from __future__ import annotations

import subprocess
import sys

import pytest

from plaita.errors import ConfigError
from plaita.flows import Flow, Schedule
from tests.support.lease_workers import ROOT, worker_env

NEVER = ("0 0 30 2 *", "0 0 31 4 *", "0 0 31 2 * 0")


# -- refused at definition ----------------------------------------------------------------------


@pytest.mark.parametrize("cron", NEVER)
def test_a_cron_that_never_fires_is_refused_naming_the_flow(cron: str) -> None:
    with pytest.raises(ConfigError, match="never fires"):
        Schedule(cron)
    with pytest.raises(ConfigError, match=r"flow 'nightly'.*never fires"):
        Flow("nightly", schedule=cron)


@pytest.mark.parametrize("command", [("keeper", "--once"), ("worker",), ("schedules", "list")])
def test_a_never_firing_cron_exits_2_with_one_line_naming_the_flow(command: tuple[str, ...]) -> None:
    url = "redis://127.0.0.1:1/0"  # never reached: the module is refused first
    cmd = [sys.executable, "-m", "plaita", *command, "--flows", "tests.flows.schedule_never", "--redis-url", url]
    done = subprocess.run(cmd, cwd=str(ROOT), env=worker_env(url), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert "never-fires" in line and "never fires" in line and "Traceback" not in done.stderr
