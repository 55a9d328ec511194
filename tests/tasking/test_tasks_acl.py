"""Least privilege for named tasks: a --tasks worker runs under the flow worker's ACL (its retries
go to the delayed set, which its reclaim pass moves) and TaskClient under the producer's (a
delayed enqueue too), with nothing denied."""

from __future__ import annotations

import pytest
import redis

from plaita import Settings, TaskClient, start_worker
from plaita.store.acl import FLOW_WORKER_ACL_RULES, PRODUCER_ACL_RULES
from tests.ops import test_security
from tests.ops.test_security import MakeUser, _denials
from tests.support import named_tasks
from tests.support.workers import wait_for

pytestmark = pytest.mark.redis

acl_user = test_security.acl_user
QUEUE = "plaita:test:named-acl"
WAIT_S = 30.0


def test_a_tasks_worker_and_a_task_client_need_only_the_documented_rules(
    acl_user: MakeUser, rclient: redis.Redis
) -> None:
    worker_url = acl_user("plaita-flow-worker", "worker-pw", FLOW_WORKER_ACL_RULES)
    producer_url = acl_user("plaita-producer", "producer-pw", PRODUCER_ACL_RULES)
    named_tasks.CALLS.clear()
    settings = Settings(redis_url=worker_url, queue_name=QUEUE, consumer_name="acl-c", read_block_ms=100)
    with (
        start_worker(settings, tasks="tests.support.named_tasks"),
        TaskClient.from_url(producer_url, queue_name=QUEUE) as client,
    ):
        assert client.result(client.enqueue("add", [1, 2]), timeout_s=WAIT_S) == 3
        assert client.result(client.enqueue("fails_once", ["acl"]), timeout_s=WAIT_S) == "ok on attempt 2"
        assert client.result(client.enqueue("add", [2, 2], delay_s=0.2), timeout_s=WAIT_S) == 4
        client.enqueue("fire_and_forget", [1])
        client.queue.enqueue({"type": "send_email", "to": "acl"})
        wait_for(lambda: "fire_and_forget" in named_tasks.CALLS and "send_email" in named_tasks.CALLS, WAIT_S, "both")
        wait_for(lambda: not rclient.keys(f"{QUEUE}:result:*") or _only_kept(rclient), WAIT_S, "the forget")
    assert _denials(rclient) == []


def _only_kept(rclient: redis.Redis) -> bool:
    """Every record left is a kept result (the fire-and-forget task's record was deleted)."""
    docs = [rclient.get(k) for k in rclient.keys(f"{QUEUE}:result:*")]
    return all(d is not None and '"done"' in d for d in docs)
