"""The standalone keeper's /metrics, /healthz and /readyz (``plaita keeper --metrics-port``).

The counting and the readiness rule are tested on ``KeeperMetrics`` alone (a fake clock, no
Redis); the endpoint end to end on keeper processes against a private redis-server that is
frozen for real, with a second keeper on standby.
"""

from __future__ import annotations

import subprocess
import urllib.error
import urllib.request
from contextlib import AbstractContextManager
from pathlib import Path

from plaita.flows.keeper.keeper_types import KeeperPass
from plaita.ops.keeper_metrics import KeeperMetrics
from tests.support.lease_workers import keeper_proc
from tests.support.ops import QUEUE, parse_metrics, plaita, wait_until
from tests.support.redis_server import RedisServer, free_port

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def sample(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


class TestKeeperMetrics:
    def test_an_acting_pass_counts_what_it_did_and_makes_the_keeper_ready(self) -> None:
        m = KeeperMetrics(clock_s=lambda: 1000.0)
        assert m.readiness() == (False, "starting: no keeper pass yet")
        m.on_pass(KeeperPass(timeouts=["a", "b"], orphaned=["c"], corrupt=["d"], scheduled=["e"], duration_s=0.02))
        s = parse_metrics(m.render().decode())
        assert sample(s, "plaita_keeper_passes_total", kind="full", role="acting") == 1
        assert sample(s, "plaita_keeper_actions_total", action="timeout") == 2
        assert sample(s, "plaita_keeper_actions_total", action="orphaned") == 1
        assert sample(s, "plaita_keeper_actions_total", action="corrupt_skipped") == 1
        assert sample(s, "plaita_keeper_actions_total", action="scheduled") == 1
        assert sample(s, "plaita_keeper_actions_total", action="retry") == 0  # shown before it happens
        assert sample(s, "plaita_keeper_acting") == 1
        assert sample(s, "plaita_keeper_last_success_timestamp_seconds") == 1000.0
        assert sample(s, "plaita_keeper_pass_duration_seconds_count", kind="full") == 1
        assert m.readiness() == (True, "acting")

    def test_failures_make_it_unready_with_the_reason_until_a_full_pass_works(self) -> None:
        now = [100.0]
        m = KeeperMetrics(clock_s=lambda: now[0])
        m.on_pass(KeeperPass(acting=False))
        assert m.readiness() == (True, "standby: another keeper holds plaita:keeper:lease")
        m.on_failure(TimeoutError("Timeout reading from socket"))
        now[0] = 130.0
        m.on_failure(ConnectionError("Connection refused"))
        ready, reason = m.readiness()
        assert not ready and reason == "keeper passes failing for 30 s: ConnectionError: Connection refused"
        m.on_pass(KeeperPass(full=False, wakes=["w"]))  # the deadline part alone says nothing of the rest
        assert not m.readiness()[0]
        s = parse_metrics(m.render().decode())
        assert sample(s, "plaita_keeper_pass_failures_total", error="TimeoutError") == 1
        assert sample(s, "plaita_keeper_pass_failures_total", error="ConnectionError") == 1
        assert sample(s, "plaita_keeper_passes_total", kind="deadlines", role="acting") == 1
        assert sample(s, "plaita_keeper_actions_total", action="wake") == 1
        assert sample(s, "plaita_keeper_acting") == 1
        m.on_pass(KeeperPass())
        assert m.readiness() == (True, "acting")
        m.on_failure(TimeoutError("again"))
        assert m.readiness()[1].startswith("keeper passes failing for 0 s")  # a new outage counts from 0

    def test_a_long_error_is_cut_in_the_reason(self) -> None:
        m = KeeperMetrics()
        m.on_failure(RuntimeError("x" * 5000))
        assert len(m.readiness()[1]) < 300


def http(port: int, path: str) -> tuple[int, str] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
            return int(r.status), r.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()
    except OSError:
        return None  # not listening yet


def acting(port: int) -> float:
    got = http(port, "/metrics")
    assert got is not None and got[0] == 200
    return sample(parse_metrics(got[1]), "plaita_keeper_acting") or 0.0


def ready_with(port: int, code: int, text: str) -> bool:
    got = http(port, "/readyz")
    return got is not None and got[0] == code and text in got[1]


def keeper(url: str, tmp_path: Path, port: int) -> AbstractContextManager[subprocess.Popen[bytes]]:
    args = ("--metrics-host", "127.0.0.1", "--metrics-port", str(port), "--interval-s", "0.2")
    return keeper_proc(url, tmp_path, f"keeper-{port}", *args, "--keeper-lease-ttl-s", "3")


def test_keeper_endpoint_acting_standby_outage_and_back(private_redis: RedisServer, tmp_path: Path) -> None:
    port_a, port_b = free_port(), free_port()
    with keeper(private_redis.url, tmp_path, port_a) as a:
        wait_until(lambda: ready_with(port_a, 200, "acting"), 20, "keeper A /readyz 200 acting")
        with keeper(private_redis.url, tmp_path, port_b) as b:
            wait_until(lambda: ready_with(port_b, 200, "standby"), 20, "keeper B /readyz 200 standby")
            got_b = http(port_b, "/metrics")
            assert got_b is not None and got_b[0] == 200
            assert sample(parse_metrics(got_b[1]), "plaita_keeper_acting") == 0
            assert (http(port_b, "/healthz") or (0, ""))[0] == 200
            private_redis.freeze()
            try:
                wait_until(lambda: ready_with(port_a, 503, "keeper passes failing"), 20, "A /readyz 503 while frozen")
                got = http(port_a, "/metrics")  # a scrape answers at once during the outage
                assert got is not None and got[0] == 200
                failures = [
                    v for (name, _), v in parse_metrics(got[1]).items() if name == "plaita_keeper_pass_failures_total"
                ]
                assert sum(failures) >= 1
            finally:
                private_redis.thaw()
            # Once Redis is back both are ready again; the lease may have expired meanwhile, so
            # either may act now, but exactly one does.
            for port in (port_a, port_b):
                wait_until(lambda p=port: ready_with(p, 200, ""), 20, f"/readyz 200 on {port} once Redis is back")
            wait_until(lambda: acting(port_a) + acting(port_b) == 1, 20, "exactly one keeper acting")
            assert a.poll() is None and b.poll() is None
        got_a = http(port_a, "/metrics")
        assert got_a is not None
        assert (sample(parse_metrics(got_a[1]), "plaita_keeper_passes_total", kind="full", role="acting") or 0) >= 1
    assert a.returncode == 0, (tmp_path / f"keeper-{port_a}.stderr").read_text()


def test_keeper_metrics_port_out_of_range_exits_2_with_one_line(redis_url: str) -> None:
    done = plaita(redis_url, "keeper", "--metrics-port", "70000", "--once")
    assert done.returncode == 2
    assert "--metrics-port" in done.stderr and "Traceback" not in done.stderr


def test_keeper_metrics_port_in_use_exits_2_with_one_line(redis_url: str) -> None:
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        port = held.getsockname()[1]
        done = plaita(redis_url, "keeper", "--metrics-host", "127.0.0.1", "--metrics-port", str(port), "--once")
    assert done.returncode == 2
    assert "cannot listen" in done.stderr and "Traceback" not in done.stderr


def test_an_embedded_keeper_counts_its_passes_on_the_workers_metrics(redis_url: str) -> None:
    from plaita import Settings, start_worker

    settings = Settings(redis_url=redis_url, queue_name=QUEUE, consumer_name="embedded-metrics:0")
    with start_worker(settings, flows=["tests.flows.flowdefs"], keeper=True) as service:

        def full_passes() -> float:
            text = service.ops.metrics.render().decode()
            return sample(parse_metrics(text), "plaita_keeper_passes_total", kind="full", role="acting") or 0.0

        wait_until(full_passes, 20, "the embedded keeper's first full pass on the worker's /metrics")
        text = service.ops.metrics.render().decode()
        assert sample(parse_metrics(text), "plaita_worker_up") == 1  # one registry: the worker's
        assert text.count("# TYPE plaita_alerts_sent_total counter") == 1  # the worker's, not twice
        service.request_stop()
        assert service.join(10)
