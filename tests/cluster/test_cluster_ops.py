"""Operating a fleet on Redis Cluster: the admin commands aggregate over partitions, the
registry lists the workers, remote control reaches them, and flows run with staged writes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from plaita.config import Settings
from plaita.flows.producer.client import FlowClient
from plaita.store.streams.partitioned import open_queue
from tests.support.lease_workers import QUEUE, worker_proc
from tests.support.redis_cluster import ClusterServers
from tests.support.workers import ROOT, wait_for

pytestmark = pytest.mark.redis

PARTITIONS = "6"


def plaita(cluster: ClusterServers, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    common = ["--redis-url", cluster.url, "--queue-name", QUEUE, "--partitions", PARTITIONS]
    # `executions` takes them before its action; the other commands after theirs.
    head, tail = (args[:1], args[1:]) if args[0] == "executions" else (args, ())
    cmd = [sys.executable, "-m", "plaita", *head, *common, *tail]
    return subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=60, cwd=str(ROOT))


def test_admin_commands_and_remote_control_on_a_cluster(clean_cluster: ClusterServers, tmp_path: Path) -> None:
    ks = open_queue(Settings(redis_url=clean_cluster.url, queue_name=QUEUE, partitions=6)).keyspace
    with worker_proc(clean_cluster.url, tmp_path, "ops", "--partitions", PARTITIONS, "--read-block-ms", "200") as w:
        w.wait_reading(20)
        clean_cluster.client().xadd(ks.stream(4), {"payload": "{not json", "schema_version": "1"})
        wait_for(lambda: w.counters().get("dead_lettered", 0) == 1, 15, "the bad task dead-lettered")
        workers = plaita(clean_cluster, "workers", "--json")
        assert workers.returncode == 0, workers.stderr
        [entry] = json.loads(workers.stdout)
        status = plaita(clean_cluster, "status", "--json")
        assert status.returncode == 0, status.stderr
        stats = json.loads(status.stdout)
        assert len(stats["partitions"]) == 6 and stats["dlq_length"] == 1 and stats["consumers"] == 1
        listed = plaita(clean_cluster, "dlq", "list", "--json")
        assert listed.returncode == 0, listed.stderr
        [row] = json.loads(listed.stdout)
        assert row["dlq_id"].startswith("4/") and "JSON" in row["reason"], row

        def own_answer_reading() -> bool:
            one = plaita(clean_cluster, "status", str(entry["instance_id"]), "--json")
            assert one.returncode == 0, one.stderr
            return bool(json.loads(one.stdout)["state"] == "READING")  # not a passing RECLAIMING

        wait_for(own_answer_reading, 10, "the worker's own answer READING")
        stop = plaita(clean_cluster, "stop", "--all")
        assert stop.returncode == 0 and "1 worker(s) received it" in stop.stdout, stop.stdout + stop.stderr
        assert w.proc.wait(10) == 0


def test_a_flow_runs_on_a_cluster_with_staged_writes_in_its_slot(
    clean_cluster: ClusterServers, tmp_path: Path, cluster_flows: FlowClient
) -> None:
    flows, q = cluster_flows, cluster_flows.queue
    args = ("--partitions", PARTITIONS, "--flows", "tests.cluster.cluster_flows", "--read-block-ms", "200")
    with worker_proc(clean_cluster.url, tmp_path, "flows", *args) as w:
        eids = [flows.start("tally", {"n": i}) for i in range(6)]
        docs = [flows.wait(eid, 30) for eid in eids]
        again = flows.start("tally", {"n": 99}, dedup_key="once")
        assert flows.wait(again, 30)["status"] == "completed"
        assert flows.start("tally", {"n": 100}, dedup_key="once") == again  # the dedup key's partition
        assert w.terminate() == 0
    assert [d["status"] for d in docs] == ["completed"] * 6
    client = clean_cluster.client()
    for eid in eids:
        tag = q.keyspace.slot_tag(eid)
        assert client.get(f"plaita:test:tally:{eid}:{tag}") == b"2"  # two steps, staged once each
    assert [flows.events(eid) for eid in eids] == [{"ran_one": i, "ran_two": i} for i in range(6)]
    listed = plaita(clean_cluster, "executions", "list", "--status", "completed", "--json")
    assert listed.returncode == 0, listed.stderr
    assert {d["execution_id"] for d in json.loads(listed.stdout)} == {*eids, again}


def test_the_keeper_times_out_suspensions_on_every_partition(clean_cluster: ClusterServers, tmp_path: Path) -> None:
    """Suspended executions on all partitions: a resume goes to its execution's partition, and the
    keeper finds the deadlines of every partition and enqueues their timeouts."""
    q = open_queue(Settings(redis_url=clean_cluster.url, queue_name=QUEUE, consumer_name="p", partitions=6))
    flows = FlowClient(q)
    args = ("--partitions", PARTITIONS, "--flows", "tests.cluster.cluster_flows", "--read-block-ms", "200")
    keeper_cmd = [sys.executable, "-m", "plaita", "keeper", "--redis-url", clean_cluster.url, "--queue-name", QUEUE]
    keeper_cmd += ["--partitions", PARTITIONS, "--interval-s", "0.3", "--keeper-lease-ttl-s", "2"]
    with worker_proc(clean_cluster.url, tmp_path, "naps", *args) as w:
        ids = [f"nap-{i}" for i in range(200)]  # two per partition, so every partition has deadlines
        picked = [e for p in range(6) for e in [x for x in ids if q.keyspace.partition_of(x) == p][:2]]
        timed = [flows.start("nap", {"timeout_s": 0.5}, execution_id=e) for e in picked]
        woken = flows.start("nap", {"timeout_s": 3600})
        wait_for(lambda: (flows.get(woken) or {}).get("status") == "suspended", 20, "suspended")
        flows.resume(woken, "event")
        assert flows.wait(woken, 20)["state"]["resumed_by"] == "event"
        with subprocess.Popen(
            keeper_cmd, cwd=str(ROOT), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        ) as keeper:
            try:
                docs = [flows.wait(e, 30) for e in timed]
            finally:
                keeper.terminate()
                keeper.wait(10)
        assert w.terminate() == 0
    assert [d["state"]["resumed_by"] for d in docs] == ["timeout"] * len(timed)
    q.close()


def test_a_fan_out_joins_across_masters_without_cross_slot_calls(
    clean_cluster: ClusterServers, tmp_path: Path, cluster_flows: FlowClient
) -> None:
    """40 children of one parent land on the partitions of every master; each child's end is
    recorded in the parent's slot (one key per call): the parent joins once, results in order."""
    flows, q = cluster_flows, cluster_flows.queue
    args = ("--partitions", PARTITIONS, "--flows", "tests.cluster.cluster_flows", "--read-block-ms", "200",
            "--concurrency", "4")  # fmt: skip
    with worker_proc(clean_cluster.url, tmp_path, "fan", *args) as w:
        parent = flows.start("fan", {"n": 40})
        doc = flows.wait(parent, 60)
        assert w.terminate() == 0
    assert doc["status"] == "completed", doc
    kids = [f"{parent}:spread:0:{i}" for i in range(40)]
    assert doc["state"]["outcomes"] == [[k, "completed", {"two": i}] for i, k in enumerate(kids)]
    masters = {clean_cluster.master_of_key(q.keyspace.execution_key(k)).port for k in kids}
    assert masters == {m.port for m in clean_cluster.masters()}
    client = clean_cluster.client()
    assert client.get(f"plaita:test:joined:{parent}:{q.keyspace.slot_tag(parent)}") == b"1"
    for k in kids:
        assert client.get(f"plaita:test:tally:{k}:{q.keyspace.slot_tag(k)}") == b"2"  # each step once
