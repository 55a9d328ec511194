"""The outage probe cannot be turned into a way to read other HTTP pages through the dashboard.

Whoever can write one registry key chooses the address the dashboard probes during a Redis
outage. Real HTTP servers on loopback play the hostile endpoints: one redirecting to a page
holding a secret (by address and by host name), one answering a huge body, one dripping a
byte at a time. The secret must never appear in /api/overview or any page, the secret
server must never be asked, and every probe must end within its time bound.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from plaita.dashboard import probe as probe_module
from plaita.dashboard.probe import MAX_ANSWER_BYTES, PROBE_TIMEOUT_S, UNPARSEABLE, parse_metrics, parse_readiness, probe
from tests.dashboard.conftest import MakeDashboard, register, sample
from tests.support.ops import ops_worker, wait_until
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.redis

SECRET = "INTERNAL-SECRET-7f3a9c"
METRICS_OK = (
    "# HELP plaita_worker_up 1 while the worker process runs\n# TYPE plaita_worker_up gauge\nplaita_worker_up 1.0\n"
    'plaita_worker_state{state="BACKOFF"} 0.0\nplaita_worker_state{state="READING"} 1.0\n'
    "plaita_worker_in_flight 3.0\n"
)
#: (status, headers, body chunks) for a path.
Answer = tuple[int, dict[str, str], Callable[[], Iterator[bytes]]]


def _body(text: str) -> Callable[[], Iterator[bytes]]:
    return lambda: iter([text.encode()])


class Endpoint:
    """A real HTTP server on 127.0.0.1 answering ``routes[path]``; counts requests and bytes sent."""

    def __init__(self, routes: Callable[[Endpoint], dict[str, Answer]]) -> None:
        self.hits: list[str] = []
        self.sent_bytes = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                owner.hits.append(self.path)
                status, headers, chunks = owner.routes.get(self.path, (404, {}, _body("no")))
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                try:
                    for chunk in chunks():
                        self.wfile.write(chunk)
                        owner.sent_bytes += len(chunk)
                except OSError:
                    pass  # the prober hung up: what this server is here to show

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.routes = routes(self)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def endpoints() -> Iterator[Callable[[Callable[[Endpoint], dict[str, Answer]]], Endpoint]]:
    made: list[Endpoint] = []

    def make(routes: Callable[[Endpoint], dict[str, Answer]]) -> Endpoint:
        made.append(Endpoint(routes))
        return made[-1]

    yield make
    for e in made:
        e.close()


def _huge(prefix: str, total_bytes: int) -> Callable[[], Iterator[bytes]]:
    def chunks() -> Iterator[bytes]:
        yield prefix.encode()
        line = f"# {SECRET} {'x' * 100}\n".encode()
        block = line * (65536 // len(line))
        for _ in range(total_bytes // len(block)):
            yield block

    return chunks


def _drip() -> Iterator[bytes]:
    yield b"plaita_worker_up 1.0\n"
    for _ in range(100):  # 10 s at most: far beyond the probe's bound
        time.sleep(0.1)  # the hostile server's own pace, not a test synchronisation
        yield b"x"


def _outage_overview(dash: object, server: RedisServer) -> str:
    """Sample while Redis answers, stop it, sample again (the outage) and probe; /api/overview."""
    snap = sample(dash)  # type: ignore[arg-type]
    assert snap["redis"]["ok"] is True
    server.stop()
    monitor = dash.app.state.dashboard.monitor  # type: ignore[attr-defined]
    monitor.sample_once()
    assert monitor.snapshot()["redis"]["ok"] is False
    monitor.probe_once()
    r = dash.get("/api/overview")  # type: ignore[attr-defined]
    assert r.status_code == 200
    return str(r.text)


def _pages(dash: object) -> str:
    return "\n".join(dash.get(p).text for p in ("/", "/fragment/overview", "/workers"))  # type: ignore[attr-defined]


def test_redirects_are_not_followed_and_nothing_fetched_is_shown(
    make_dashboard: MakeDashboard, private_redis: RedisServer, endpoints: Callable[..., Endpoint]
) -> None:
    secret = endpoints(
        lambda e: {
            "/metrics": (200, {}, _body(METRICS_OK)),
            "/readyz": (503, {}, _body(f"stalled: {SECRET}\n")),
            "/secret": (503, {}, _body(f"{SECRET}\n")),
        }
    )
    to_secret = f"http://127.0.0.1:{secret.port}"
    by_name = f"http://localhost:{secret.port}"
    redirects_all = endpoints(
        lambda e: {p: (302, {"Location": to_secret + p}, _body("")) for p in ("/metrics", "/readyz")}
    )
    redirects_ready = endpoints(
        lambda e: {
            "/metrics": (200, {}, _body(METRICS_OK)),
            "/readyz": (307, {"Location": by_name + "/secret"}, _body("")),
        }
    )
    client = private_redis.client()
    register(client, "w-all", metrics_host="127.0.0.1", metrics_port=redirects_all.port, ready_reason="ok: READING")
    register(client, "w-ready", metrics_host="127.0.0.1", metrics_port=redirects_ready.port)
    client.close()
    dash = make_dashboard(url=private_redis.url)
    overview = _outage_overview(dash, private_redis)
    assert SECRET not in overview and SECRET not in _pages(dash)
    assert secret.hits == [], "the probe followed a redirect"
    rows = {r["instance_id"]: r for r in json.loads(overview)["workers"]}
    assert rows["w-all"]["source"] == "last known"  # a redirect is no answer from a worker
    ready = rows["w-ready"]
    assert (ready["source"], ready["state"], ready["in_flight"]) == ("worker endpoint", "READING", 3)
    assert ready["ready"] is False and ready["ready_reason"] == UNPARSEABLE


def test_a_huge_or_dripping_answer_is_read_only_up_to_its_bounds(
    make_dashboard: MakeDashboard, private_redis: RedisServer, endpoints: Callable[..., Endpoint]
) -> None:
    huge = endpoints(
        lambda e: {
            "/metrics": (200, {}, _huge(METRICS_OK, 50_000_000)),
            "/readyz": (503, {}, _huge(f"redis transient failure: {SECRET}\n", 50_000_000)),
        }
    )
    drip = endpoints(lambda e: {"/metrics": (200, {}, _drip), "/readyz": (200, {}, _drip)})
    client = private_redis.client()
    register(client, "w-huge", metrics_host="127.0.0.1", metrics_port=huge.port)
    register(client, "w-drip", metrics_host="127.0.0.1", metrics_port=drip.port)
    client.close()
    dash = make_dashboard(url=private_redis.url)
    started = time.monotonic()
    overview = _outage_overview(dash, private_redis)
    assert time.monotonic() - started < 4 * PROBE_TIMEOUT_S + 3.0  # two probes of two endpoints, plus the rest
    assert SECRET not in overview and SECRET not in _pages(dash)
    rows = {r["instance_id"]: r for r in json.loads(overview)["workers"]}
    assert rows["w-huge"]["source"] == "worker endpoint"
    assert rows["w-huge"]["ready_reason"] == "Redis failing (transient)" and rows["w-huge"]["ready"] is False
    assert rows["w-drip"]["source"] == "last known"  # no state within the bound: no answer
    assert huge.sent_bytes < 10_000_000, "the prober read the whole huge answer"


def test_one_probe_reads_at_most_the_cap_and_ends_in_time(endpoints: Callable[..., Endpoint]) -> None:
    huge = endpoints(lambda e: {"/metrics": (200, {}, _huge(METRICS_OK, 50_000_000))})
    got: list[int] = []

    def counting_get(host: str, port: int, path: str) -> tuple[int, str] | None:
        answer = original(host, port, path)
        got.append(len(answer[1]) if answer else 0)
        return answer

    original = probe_module._get
    probe_module._get = counting_get  # type: ignore[assignment]
    try:
        started = time.monotonic()
        answer = probe("127.0.0.1", huge.port)
        took_s = time.monotonic() - started
    finally:
        probe_module._get = original  # type: ignore[assignment]
    assert answer is not None and answer["state"] == "READING"
    assert got and max(got) <= MAX_ANSWER_BYTES
    assert took_s < 4 * PROBE_TIMEOUT_S + 1.0  # two requests, each bounded by the probe itself


@pytest.mark.parametrize(
    ("code", "text", "expected"),
    [
        (200, "ok: READING\n", (True, "ok")),
        (503, "stalled: no consume-loop progress for 31 s\n", (False, "stalled: no consume-loop progress")),
        (503, f"auth: Redis rejected the credentials {SECRET}\n", (False, "Redis refused the credentials")),
        (503, "stopping\n", (False, "stopping")),
        (200, "stalled: 3 s\n", (False, UNPARSEABLE)),  # a worker never answers 200 unless ok
        (503, "ok: READING\n", (False, UNPARSEABLE)),
        (302, "", (False, UNPARSEABLE)),
        (503, f"<html>{SECRET}</html>", (False, UNPARSEABLE)),
        (503, "\x00\xff" * 50, (False, UNPARSEABLE)),
    ],
)
def test_readiness_is_one_of_a_fixed_list(code: int, text: str, expected: tuple[bool, str]) -> None:
    assert parse_readiness(code, text) == expected


def test_metrics_accept_only_worker_states_and_bounded_counts() -> None:
    assert parse_metrics(METRICS_OK) == ("READING", 3)
    assert parse_metrics('plaita_worker_state{state="PWNED"} 1.0\nplaita_worker_in_flight 99999999\n') == (None, None)
    assert parse_metrics('plaita_worker_state{state="<b>x</b>"} 1.0\n') == (None, None)


def test_the_registry_decides_nothing_but_a_literal_address() -> None:
    assert probe_module.probe_address({"metrics_port": 9100, "metrics_host": "internal.example"}) is None
    assert probe_module.probe_address({"metrics_port": 9100, "metrics_host": "::1"}) == ("::1", 9100)
    assert probe_module.probe_address({"metrics_port": True, "metrics_host": "127.0.0.1"}) is None


def test_a_real_worker_is_understood(redis_url: str, tmp_path: Path) -> None:
    """The parser against a real worker's /metrics and /readyz, not only hand-written answers."""
    expected = {"state": "READING", "in_flight": 0, "ready": True, "ready_reason": "ok"}
    seen: list[object] = []

    def understood() -> bool:  # READING and RECLAIMING alternate: wait for the one expected
        seen.append(probe("127.0.0.1", w.metrics_port))
        return seen[-1] == expected

    with ops_worker(redis_url, tmp_path) as w:
        wait_until(understood, 10, "READING and ready from the worker's endpoint")
