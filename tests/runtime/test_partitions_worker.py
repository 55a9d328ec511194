"""A worker on a partitioned queue (one real server): every task exactly once on every partition,
assigned subsets, flows with staged writes in the execution's slot, and the CLI's routing."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pytest
import redis

from plaita.config import Settings
from plaita.flows.model.context import StepContext
from plaita.flows.producer.client import FlowClient
from plaita.store.stats import is_settled, stream_stats_or_empty
from plaita.store.streams.partitioned import PartitionedQueue, open_queue
from plaita.tasks import CancelFlag, Task
from tests.support.workers import ROOT, Recorder, running_worker, wait_for

pytestmark = pytest.mark.redis

QUEUE = "plaita:test:queue"


def producer(url: str, partitions: int) -> PartitionedQueue:
    q = open_queue(Settings(redis_url=url, queue_name=QUEUE, consumer_name="producer", partitions=partitions))
    assert isinstance(q, PartitionedQueue)
    return q


def bodies(n: int, plain: int) -> list[dict[str, object]]:
    with_ids = [{"type": "start", "flow_id": "f", "execution_id": f"e{i}", "params": {"n": i}} for i in range(n)]
    return with_ids + [{"type": "start", "flow_id": "f", "params": {"n": n + i}} for i in range(plain)]


def test_every_task_runs_once_across_all_partitions(redis_url: str) -> None:
    q = producer(redis_url, 4)
    ids = q.enqueue_many(bodies(120, 40))
    assert {i.split("/")[0] for i in ids} == {"0", "1", "2", "3"}
    rec = Recorder()
    with running_worker(redis_url, recorder=rec, partitions=4, concurrency=4):
        rec.wait_count(160, timeout_s=30)
        wait_for(lambda: is_settled(q), 10, "every partition acked")
    seen = Counter(e.n for e in rec.executions)
    assert sorted(seen) == list(range(160)) and set(seen.values()) == {1}
    assert sorted(rec.ids()) == sorted(ids)  # the handler sees the qualified ids the producer got
    q.close()


def test_an_assigned_subset_leaves_the_other_partitions_alone(redis_url: str) -> None:
    q = producer(redis_url, 4)
    ids = q.enqueue_many(bodies(80, 0))
    mine = [i for i in ids if i.split("/")[0] in ("1", "3")]

    def lengths() -> list[int]:  # no worker creates the group on 0 and 2
        return [int(r["length"]) for r in stream_stats_or_empty(q)["partitions"]]

    rec = Recorder()
    with running_worker(redis_url, recorder=rec, partitions=4, partitions_assigned=(1, 3)):
        rec.wait_count(len(mine), timeout_s=20)
        wait_for(lambda: lengths()[1::2] == [0, 0], 10, "partitions 1 and 3 acked")
    assert sorted(rec.ids()) == sorted(mine)
    left = [sum(1 for x in ids if x.startswith(f"{p}/")) for p in (0, 2)]
    assert lengths() == [left[0], 0, left[1], 0]
    q.close()


def test_staged_writes_must_carry_the_execution_tag() -> None:
    """With partitions a staged key outside the execution's slot is refused with the fix in the message."""
    ctx = StepContext(
        execution_id="e1", flow_id="f", step="s", params={}, state={}, results={}, resume=None, attempt=1,
        cancel=CancelFlag(), slot_tag="{p1}",
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"ctx\.key"):
        ctx.stage("plaita:app:counter", 1)
    ctx.stage(ctx.key("plaita:app:counter"), 1)
    assert [s.key for s in ctx.staged] == ["plaita:app:counter:{p1}"]


def test_cli_enqueue_routes_and_status_sums_partitions(redis_url: str, rclient: redis.Redis) -> None:
    def plaita(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "plaita", *args, "--redis-url", redis_url, "--queue-name", QUEUE]
        return subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=60, cwd=str(ROOT))

    lines = "\n".join(json.dumps(b) for b in bodies(30, 0))
    out = plaita("enqueue", "--partitions", "3", stdin=lines)
    assert out.returncode == 0, out.stderr
    ids = out.stdout.split()
    assert len(ids) == 30 and {i.split("/")[0] for i in ids} == {"0", "1", "2"}
    status = plaita("status", "--partitions", "3", "--json")
    assert status.returncode == 0, status.stderr
    stats = json.loads(status.stdout)
    assert stats["length"] == 30 == sum(p["length"] for p in stats["partitions"])
    bad = plaita("enqueue", "--partitions", "0", "{}")
    assert bad.returncode == 2 and "--partitions must be within" in bad.stderr and "Traceback" not in bad.stderr


def test_a_misrouted_task_goes_to_the_dlq_and_a_requeue_routes_it(redis_url: str, rclient: redis.Redis) -> None:
    """A producer that XADDs straight to the wrong partition: the task is dead-lettered with the
    fix in the reason, and `dlq requeue` puts it on its own partition, where it runs."""
    from plaita.store.streams.dlq import DeadLetterQueue

    q = producer(redis_url, 3)
    eid = next(e for e in (f"m{i}" for i in range(100)) if q.keyspace.partition_of(e) == 2)
    body = {"type": "start", "flow_id": "f", "execution_id": eid, "params": {"n": 7}}
    q.ensure_group()
    rclient.xadd(q.keyspace.stream(0), {"payload": json.dumps(body), "schema_version": "1"})
    rec = Recorder()
    with running_worker(redis_url, recorder=rec, partitions=3):
        dlq = DeadLetterQueue(q)
        wait_for(lambda: dlq.length() == 1, 10, "the misrouted task dead-lettered")
        [row] = dlq.oldest(1)
        assert "misrouted" in row["reason"] and "partition 2" in row["reason"] and rec.count() == 0
        [(_, new_id)] = dlq.requeue([row["dlq_id"]])
        assert new_id.startswith("2/")
        rec.wait_count(1, timeout_s=10)
    assert [e.n for e in rec.executions] == [7] and dlq.length() == 0
    q.close()


def test_a_handler_fences_its_writes_with_the_tasks_keyspace(redis_url: str, rclient: redis.Redis) -> None:
    """fenced_set(..., keyspace=task.keyspace) finds the partition's lease: the write lands."""
    from plaita.store.client import make_client
    from plaita.store.leases import fenced_set

    results: list[bool] = []
    client = make_client(redis_url, socket_timeout_s=5.0)

    def handler(task: Task) -> None:
        key = f"plaita:test:out:{task.execution_id}:{task.keyspace.slot_tag(task.execution_id)}"
        results.append(fenced_set(client, task.execution_id, task.fencing_token, key, "v", keyspace=task.keyspace))

    q = producer(redis_url, 3)
    q.enqueue_many(bodies(6, 0))
    with running_worker(redis_url, recorder=handler, partitions=3):  # type: ignore[arg-type]
        wait_for(lambda: len(results) == 6, 10, "six fenced writes")
    assert results == [True] * 6
    client.close()
    q.close()


def test_flow_client_refuses_a_dedup_key_its_execution_id_cannot_meet(redis_url: str) -> None:
    q = producer(redis_url, 6)
    flows = FlowClient(q)
    eid = next(e for e in (f"x{i}" for i in range(100)) if q.keyspace.partition_of(e) != q.keyspace.partition_of("k"))
    with pytest.raises(ValueError, match="dedup key is seen only in its own partition"):
        flows.start("f", execution_id=eid, dedup_key="k")
    q.close()
