"""Redis faults: the outage banner, live worker states from their endpoints, recovery; ACL; no password leaks."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from starlette.testclient import TestClient

from plaita.dashboard.app import DashboardConfig, create_app
from plaita.store.acl import ADMIN_ACL_RULES, DASHBOARD_READ_ACL_RULES, setuser_command
from plaita.store.keyspace import DEFAULT
from tests.dashboard.conftest import SAME_ORIGIN, TOKEN, MakeDashboard, dead_letter, login, plant, register, sample
from tests.support.ops import QUEUE, enqueue, ops_worker, task, wait_until
from tests.support.redis_server import RedisServer, free_port

pytestmark = pytest.mark.redis

PASSWORD = "s3cret-Pa55word-xyz"
READ_PAGES = ("/", "/fragment/overview", "/api/overview", "/workers", "/dlq", "/executions", "/login")


def _everything(dash: TestClient, extra: tuple[str, ...] = ()) -> str:
    """Every read page's body and headers, as one text to search for leaks."""
    parts = []
    for path in (*READ_PAGES, *extra):
        r = dash.get(path)
        parts.append(r.text)
        parts.extend(f"{k}: {v}" for k, v in r.headers.items())
    return "\n".join(parts)


@pytest.fixture
def read_only_user(redis_server: RedisServer, redis_url: str) -> Iterator[str]:
    """A Redis user with only the dashboard's read rules; yields its URL (with password)."""
    admin = redis_server.client(decode_responses=True)
    admin.execute_command(*setuser_command("plaita-dash", PASSWORD, DASHBOARD_READ_ACL_RULES))
    admin.execute_command("ACL", "LOG", "RESET")
    yield f"redis://plaita-dash:{PASSWORD}@127.0.0.1:{redis_server.port}/0"
    admin.execute_command("ACL", "DELUSER", "plaita-dash")
    admin.close()


class TestOutage:
    def test_redis_down_shows_the_banner_keeps_serving_and_never_leaks_the_password(
        self, make_dashboard: MakeDashboard
    ) -> None:
        url = f"redis://admin:{PASSWORD}@127.0.0.1:{free_port()}/0"  # nothing listens there
        dash = make_dashboard(url=url)
        before = time.time()
        snap = sample(dash)
        assert snap["redis"]["ok"] is False and snap["redis"]["down_since"] >= before - 1
        page = dash.get("/")
        assert page.status_code == 200 and 'id="outage"' in page.text and "Redis unavailable since" in page.text
        assert "ConnectionError" in page.text
        dlq = dash.get("/dlq")
        assert dlq.status_code == 200 and 'id="page-error"' in dlq.text
        csrf = login(dash)
        act = dash.post("/dlq/requeue", data={"id": "1-0", "csrf": csrf}, headers=SAME_ORIGIN)
        assert act.status_code == 200 and "failed: ConnectionError" in act.text
        first_since = snap["redis"]["down_since"]
        assert sample(dash)["redis"]["down_since"] == first_since, "the outage start is kept across failed samples"
        everything = _everything(dash, ("/dlq/entry/1-0",)) + act.text
        assert PASSWORD not in everything and "admin:***@" in everything

    def test_wrong_password_is_an_outage_with_the_password_hidden(
        self, make_dashboard: MakeDashboard, redis_server: RedisServer, read_only_user: str
    ) -> None:
        url = f"redis://plaita-dash:{PASSWORD}-wrong@127.0.0.1:{redis_server.port}/0"
        dash = make_dashboard(url=url, allow_actions=False)
        snap = sample(dash)
        assert snap["redis"]["ok"] is False and "Authentication" in str(snap["redis"]["error"])
        assert PASSWORD not in _everything(dash)

    def test_sampler_thread_survives_an_outage_and_recovers_by_itself(self, tmp_path: Path) -> None:
        port = free_port()
        config = DashboardConfig(
            redis_url=f"redis://127.0.0.1:{port}/0", queue_name=QUEUE, allowed_hosts=("testserver",), sample_every_s=0.1
        )
        with TestClient(create_app(config)) as dash:
            wait_until(lambda: 'id="outage"' in dash.get("/fragment/overview").text, 10, "the outage banner")
            with RedisServer(port=port, persist=False) as server:
                register(server.client(decode_responses=True), "w-back")
                wait_until(lambda: dash.get("/api/overview").json()["redis"]["ok"], 10, "recovery")

                def recovered() -> bool:  # a sample taken before the registration shows no worker yet
                    fragment = dash.get("/fragment/overview").text
                    return 'id="outage"' not in fragment and 'data-instance="w-back"' in fragment

                wait_until(recovered, 10, "the registered worker on the recovered overview", 0.05)

    @pytest.mark.chaos
    def test_frozen_redis_shows_the_worker_in_backoff_from_its_own_endpoint_then_recovers(
        self, private_redis: RedisServer, tmp_path: Path
    ) -> None:
        url = private_redis.url
        with ops_worker(url, tmp_path) as w:
            config = DashboardConfig(redis_url=url, queue_name=QUEUE, allowed_hosts=("testserver",))
            with TestClient(create_app(config, start_monitor=False)) as dash:
                monitor = dash.app.state.dashboard.monitor  # type: ignore[attr-defined]
                wait_until(lambda: _row(monitor, w.instance_id, "READING"), 10, "worker READING in the registry")
                private_redis.freeze()
                try:
                    monitor.sample_once()
                    assert monitor.snapshot()["redis"]["ok"] is False
                    wait_until(lambda: _probed(monitor, w.instance_id, "BACKOFF"), 15, "BACKOFF from the worker", 0.1)
                    html = dash.get("/fragment/overview").text
                    assert 'id="outage"' in html and "worker endpoint" in html
                finally:
                    private_redis.thaw()
                wait_until(lambda: _row(monitor, w.instance_id, "READING"), 15, "READING again after the thaw")
                assert 'id="outage"' not in dash.get("/fragment/overview").text

    def test_throughput_follows_completions(
        self, make_dashboard: MakeDashboard, redis_url: str, tmp_path: Path
    ) -> None:
        client = redis.Redis.from_url(redis_url)
        with ops_worker(redis_url, tmp_path) as w:
            dash = make_dashboard(allow_actions=False)
            for n in range(40):
                enqueue(client, task(n))
            wait_until(lambda: len(w.done_ids()) == 40, 20, "40 tasks done")

            def counted() -> bool:
                snap = sample(dash)
                return any(p[1] and p[1] > 0 for p in snap["throughput"]["points"])

            wait_until(counted, 10, "a positive completion rate", poll_s=0.3)
        client.close()


def _row(monitor: object, instance_id: str, state: str) -> bool:
    monitor.sample_once()  # type: ignore[attr-defined]
    rows = monitor.snapshot()["workers"]  # type: ignore[attr-defined]
    return any(r["instance_id"] == instance_id and r["state"] == state and r["source"] == "registry" for r in rows)


def _probed(monitor: object, instance_id: str, state: str) -> bool:
    monitor.probe_once()  # type: ignore[attr-defined]
    rows = monitor.snapshot()["workers"]  # type: ignore[attr-defined]
    return any(
        r["instance_id"] == instance_id and r["state"] == state and r["source"] == "worker endpoint" for r in rows
    )


class TestReadOnlyAcl:
    def test_read_pages_work_with_the_read_only_user_and_nothing_is_denied(
        self, make_dashboard: MakeDashboard, rclient: redis.Redis, read_only_user: str
    ) -> None:
        register(rclient, "w1")
        rclient.xgroup_create(QUEUE, "plaita-workers", id="0", mkstream=True)
        enqueue(rclient, task(1))
        dlq_id = dead_letter(rclient, reason="boom", payload={"n": 1})
        plant(rclient, "ex1", "suspended", time.time())
        # A read must not try to prune it.
        rclient.zadd(DEFAULT.status_key(0, "completed"), {"expired-state": time.time()})
        dash = make_dashboard(url=read_only_user, allow_actions=False)
        snap = sample(dash)
        assert snap["redis"]["ok"] is True and snap["stats"]["length"] == 1 and snap["stats"]["dlq_length"] == 1
        assert snap["executions"]["suspended"] == 1
        assert 'data-execution="ex1"' in dash.get("/executions").text
        for path in (*READ_PAGES, f"/dlq/entry/{dlq_id}", "/executions/ex1", "/executions?status=completed"):
            r = dash.get(path)
            assert r.status_code == 200 and 'id="page-error"' not in r.text and 'id="outage"' not in r.text, path
        denials = [e for e in rclient.acl_log() if e.get("reason") != "auth"]
        assert denials == []
        assert PASSWORD not in _everything(dash, (f"/dlq/entry/{dlq_id}",))

    def test_the_docs_quote_the_read_only_rules(self) -> None:
        doc = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text(encoding="utf-8")
        assert f"ACL SETUSER plaita-dashboard reset on >CHANGE-ME {DASHBOARD_READ_ACL_RULES}" in doc

    def test_actions_work_with_the_admin_user(
        self, make_dashboard: MakeDashboard, redis_server: RedisServer, rclient: redis.Redis
    ) -> None:
        admin = redis_server.client(decode_responses=True)
        admin.execute_command(*setuser_command("plaita-admin-d", PASSWORD, ADMIN_ACL_RULES))
        admin.execute_command("ACL", "LOG", "RESET")
        try:
            dlq_id = dead_letter(rclient, reason="r", payload={"n": 1})
            dash = make_dashboard(url=f"redis://plaita-admin-d:{PASSWORD}@127.0.0.1:{redis_server.port}/0")
            sample(dash)
            r = dash.post("/dlq/requeue", data={"id": dlq_id}, headers={"Authorization": f"Bearer {TOKEN}"})
            assert "requeued 1 dead letter(s)" in r.text and rclient.xlen(QUEUE) == 1
            assert [e for e in rclient.acl_log() if e.get("reason") != "auth"] == []
        finally:
            admin.execute_command("ACL", "DELUSER", "plaita-admin-d")
            admin.close()

    def test_the_registry_entry_says_where_the_health_endpoint_listens(
        self, redis_url: str, rclient: redis.Redis, tmp_path: Path
    ) -> None:
        with ops_worker(redis_url, tmp_path) as w:
            entry = wait_until(lambda: w.registry_entry(rclient), 10, "registry entry")
            assert entry["metrics_host"] == "127.0.0.1" and entry["metrics_port"] == w.metrics_port
