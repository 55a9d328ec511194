"""Alert webhooks from real processes on a real Redis: a worker's dead letter and failed
execution, an outage past --alert-backoff-s and its end, a keeper's orphan; a webhook that is
down or hangs changes nothing for consuming or stopping."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
import redis

from plaita.config import Settings
from plaita.flows.producer.client import FlowClient
from plaita.ops.service import start_worker
from plaita.store.client import make_client
from plaita.store.streams.queue import StreamQueue
from tests.flows.support import harness
from tests.flows.test_keeper import make_orphan
from tests.support.lease_workers import QUEUE as LEASE_QUEUE
from tests.support.ops import QUEUE, OpsWorker, enqueue, ops_worker, plaita, task, wait_until
from tests.support.redis_server import RedisServer, free_port
from tests.support.webhook import Webhook, webhook

pytestmark = pytest.mark.redis

SECRET = "alert-secret"
FLOW_ARGS = ("--flows", "tests.flows.flowdefs", "--concurrency", "2")


@pytest.fixture
def hook() -> Iterator[Webhook]:
    with webhook() as h:
        yield h


def alerting_worker(url: str, tmp_path: Path, hook_url: str, *extra: str) -> AbstractContextManager[OpsWorker]:
    return ops_worker(url, tmp_path, "--alert-webhook", hook_url, *extra, env={"PLAITA_ALERT_WEBHOOK_SECRET": SECRET})


def alerts_counted(w: OpsWorker, outcome: str, event: str) -> float:
    return w.sample(f"plaita_alerts_{outcome}_total", event=event) or 0.0


def test_dead_letter_is_posted_signed(hook: Webhook, rclient: redis.Redis, redis_url: str, tmp_path: Path) -> None:
    with alerting_worker(redis_url, tmp_path, hook.url) as w:
        mid = enqueue(rclient, {**task(1, bad=True), "execution_id": "e-dead"})
        (got,) = hook.wait_for(1, 15)
        doc = got.doc
        assert doc["event"] == "dead_letter" and doc["schema_version"] == 1
        assert doc["message_id"] == mid and doc["execution_id"] == "e-dead" and doc["flow_id"] == "f1"
        assert "handler says bad input" in doc["reason"] and doc["delivery_count"] == 1
        assert doc["consumer"] == w.consumer and doc["instance_id"] == w.instance_id and doc["queue"] == QUEUE
        assert "params" not in doc  # the task body is never sent
        assert (
            got.headers["x-plaita-signature"]
            == "sha256=" + hmac.new(SECRET.encode(), got.body, hashlib.sha256).hexdigest()
        )
        wait_until(lambda: alerts_counted(w, "sent", "dead_letter") == 1, 10, "plaita_alerts_sent_total 1")
        assert w.terminate() == 0
    assert "T0KEN" not in w.stderr() and SECRET not in w.stderr()  # the URL's token and the secret stay out of logs


def test_failed_execution_is_posted(hook: Webhook, redis_url: str, tmp_path: Path) -> None:
    client = make_client(redis_url, socket_timeout_s=5.0)
    flows = FlowClient(
        StreamQueue(client, stream=QUEUE, group="plaita-workers", consumer="p", dlq_key="", dlq_max_len=1)
    )
    try:
        with alerting_worker(redis_url, tmp_path, hook.url, *FLOW_ARGS):
            eid = flows.start("flaky", {"fatal": True})
            flows.wait(eid, 15)
            wait_until(lambda: hook.events("execution_error"), 15, "execution_error posted")
            (doc,) = hook.events("execution_error")
            assert doc["execution_id"] == eid and doc["flow_id"] == "flaky" and doc["step"] == "wobble"
            assert doc["reason"] and "traceback" not in doc and "state" not in doc
    finally:
        client.close()


def test_outage_past_the_threshold_alerts_once_then_recovers(
    hook: Webhook, private_redis: RedisServer, tmp_path: Path
) -> None:
    with alerting_worker(private_redis.url, tmp_path, hook.url, "--alert-backoff-s", "1") as w:
        private_redis.kill()
        wait_until(lambda: hook.events("backoff_stuck"), 20, "backoff_stuck posted")
        private_redis.start()
        wait_until(lambda: hook.events("backoff_recovered"), 20, "backoff_recovered posted")
        w.wait_ready(20)
        (stuck,) = hook.events("backoff_stuck")
        assert stuck["duration_s"] >= 1 and stuck["threshold_s"] == 1 and stuck["reason"]
        assert len(hook.events("backoff_recovered")) == 1
        assert w.terminate() == 0


def test_webhook_down_consuming_goes_on(rclient: redis.Redis, redis_url: str, tmp_path: Path) -> None:
    with alerting_worker(redis_url, tmp_path, f"http://127.0.0.1:{free_port()}/hook") as w:
        enqueue(rclient, task(1, bad=True))
        wait_until(lambda: alerts_counted(w, "failed", "dead_letter") == 1, 20, "plaita_alerts_failed_total 1")
        enqueue(rclient, task(2))
        wait_until(lambda: len(w.done_ids()) == 1, 10, "the next task consumed")
        w.wait_ready()
        assert w.terminate() == 0


def test_hanging_webhook_does_not_hold_the_stop(
    hook: Webhook, rclient: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    hook.mode = "hang"
    with alerting_worker(redis_url, tmp_path, hook.url) as w:
        enqueue(rclient, task(1, bad=True))
        hook.wait_for(1, 15)  # the worker's alert request hangs now
        enqueue(rclient, task(2))
        wait_until(lambda: len(w.done_ids()) == 1, 10, "consuming goes on")
        assert w.terminate(timeout_s=5) == 0  # within the generous bound, while the webhook still hangs


def test_keeper_posts_zombie_reaped(hook: Webhook, redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLAITA_TEST_REDIS_URL", redis_url)
    with harness(redis_url) as h:
        make_orphan(h, "z-alert", age_s=120)
    args = ("--once", "--zombie-after-s", "60", "--orphan-grace-s", "0", "--alert-webhook", hook.url)
    done = plaita(redis_url, "keeper", *args, queue=LEASE_QUEUE)
    assert done.returncode == 0, done.stderr
    (got,) = hook.wait_for(1)
    doc = got.doc
    assert doc["event"] == "zombie_reaped" and doc["source"] == "keeper" and doc["execution_id"] == "z-alert"
    assert doc["queue"] == LEASE_QUEUE and doc["instance_id"].startswith("keeper:") and "orphaned" in doc["reason"]
    assert "x-plaita-signature" not in got.headers


def test_embedded_keeper_posts_through_the_workers_sender(
    hook: Webhook, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PLAITA_TEST_REDIS_URL", redis_url)
    with harness(redis_url) as h:
        make_orphan(h, "z-embedded", age_s=8000)  # past the embedded keeper's default 7200 s
    settings = Settings(redis_url=redis_url, queue_name=LEASE_QUEUE, consumer_name="emb:0", alert_webhook=hook.url)
    with start_worker(settings, flows=["tests.flows.flowdefs"], keeper=True) as service:
        wait_until(lambda: hook.events("zombie_reaped"), 20, "zombie_reaped posted")
        service.request_stop()
        assert service.join(10)
    (doc,) = hook.events("zombie_reaped")
    assert doc["execution_id"] == "z-embedded" and doc["source"] == "keeper" and doc["consumer"] == "emb:0"
