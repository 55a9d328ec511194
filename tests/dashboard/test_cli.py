"""``plaita dashboard`` as a process: bad flags, port in use, token printing, SIGTERM, no password."""

from __future__ import annotations

import http.cookiejar
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest

from tests.support.ops import ROOT, clean_env, wait_until

pytestmark = pytest.mark.redis

PASSWORD = "cli-s3cret-pw-42"


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "plaita", "dashboard", *args],
        cwd=str(ROOT),
        env=clean_env(**(env or {})),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )


@dataclass
class Served:
    proc: subprocess.Popen[str]
    url: str
    lines: list[str]


@contextmanager
def serve(*args: str, env: dict[str, str] | None = None) -> Iterator[Served]:
    """Start the dashboard on a free port; yields once it printed where it serves."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "plaita", "dashboard", "--port", "0", *args],
        cwd=str(ROOT),
        env=clean_env(**(env or {})),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline()]
        assert "serving http://" in lines[0], lines[0]
        url = lines[0].split("serving ")[1].split()[0]
        yield Served(proc, url, lines)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        if proc.stdout is not None:
            proc.stdout.close()


def _get(url: str) -> tuple[int, str, str]:
    with urllib.request.urlopen(url, timeout=5) as r:
        return int(r.status), r.read().decode(), str(r.headers)


class TestFlags:
    @pytest.mark.parametrize(
        ("args", "needle"),
        [
            pytest.param(["--port", "abc"], "--port expects a number", id="port-not-a-number"),
            pytest.param(["--port", "70000"], "--port must be within 0..65535", id="port-out-of-range"),
            pytest.param(["--bind", "my host"], "--bind expects an IP address", id="bind-not-an-address"),
            pytest.param(["--allow-actions", "--token", "short"], "at least 16 characters", id="short-token"),
            pytest.param(["--redis-url", "http://x:secretpw@h/0"], "scheme must be", id="bad-url"),
            pytest.param(["--no-such-flag"], "unrecognized arguments", id="unknown-flag"),
        ],
    )
    def test_bad_flags_exit_2_with_one_line(self, args: list[str], needle: str) -> None:
        done = _run(*args)
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and needle in lines[0], done.stderr
        assert "Traceback" not in done.stderr and "secretpw" not in done.stderr

    def test_port_in_use_exits_2_with_one_line(self) -> None:
        with socket.socket() as busy:
            busy.bind(("127.0.0.1", 0))
            busy.listen(1)
            port = busy.getsockname()[1]
            done = _run("--port", str(port), "--redis-url", "redis://127.0.0.1:1/0")
        assert done.returncode == 2
        assert (
            done.stderr.strip() == f"plaita dashboard: error: cannot listen on 127.0.0.1:{port}: address already in use"
        )


class TestServing:
    def test_serves_read_only_and_stops_on_sigterm_without_printing_the_password(self, redis_url: str) -> None:
        url = redis_url.replace("redis://", f"redis://nobody:{PASSWORD}@")  # no such user: an outage
        with serve("--redis-url", url) as s:
            assert "(read-only)" in s.lines[0] and "token" not in s.lines[0]
            code, body, headers = _get(s.url)
            assert code == 200 and "read-only" in body
            wait_until(lambda: "Redis unavailable since" in _get(s.url + "fragment/overview")[1], 10, "outage banner")
            assert PASSWORD not in body + headers + _get(s.url + "api/overview")[1]
            os.kill(s.proc.pid, signal.SIGTERM)
            out, _ = s.proc.communicate(timeout=10)
            assert s.proc.returncode == 0
        assert PASSWORD not in "".join(s.lines) + out and "Traceback" not in out

    def test_a_generated_token_is_printed_once_and_works(self, redis_url: str) -> None:
        with serve("--redis-url", redis_url, "--allow-actions") as s:
            assert s.proc.stdout is not None
            token_line = s.proc.stdout.readline()
            assert token_line.startswith("plaita dashboard: action token (printed once): ")
            token = token_line.rsplit(" ", 1)[1].strip()
            request = urllib.request.Request(
                s.url + "login", data=f"token={token}".encode(), headers={"Origin": s.url.rstrip("/")}, method="POST"
            )
            opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
            with opener.open(request, timeout=5) as r:  # follows the redirect to /workers, with the cookie
                assert r.status == 200 and "actions enabled" in r.read().decode()
            os.kill(s.proc.pid, signal.SIGTERM)
            out, _ = s.proc.communicate(timeout=10)
        assert token not in out, "printed once, at start only"

    def test_a_given_token_is_never_printed(self, redis_url: str) -> None:
        token = "given-token-0123456789"
        with serve("--redis-url", redis_url, "--allow-actions", env={"PLAITA_DASHBOARD_TOKEN": token}) as s:
            os.kill(s.proc.pid, signal.SIGTERM)
            out, _ = s.proc.communicate(timeout=10)
            assert "(actions enabled)" in s.lines[0]
        assert token not in s.lines[0] + out and "action token" not in out
