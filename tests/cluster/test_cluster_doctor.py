"""``plaita doctor`` on a Redis Cluster: every master is checked and named, and the partition
count is judged against the masters."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from tests.support.lease_workers import QUEUE
from tests.support.redis_cluster import ClusterServers
from tests.support.workers import ROOT

pytestmark = pytest.mark.redis


def doctor(cluster: ClusterServers, *args: str) -> tuple[int, dict[str, Any]]:
    cmd = [sys.executable, "-m", "plaita", "doctor", "--redis-url", cluster.url, "--queue-name", QUEUE, "--json", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=str(ROOT), check=False)
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, json.loads(done.stdout)


def test_doctor_checks_every_master_of_a_cluster(clean_cluster: ClusterServers) -> None:
    code, doc = doctor(clean_cluster, "--partitions", "6")
    findings = doc["findings"]
    # The cluster's nodes run without persistence (the tier's servers): one error per master.
    persistence = [f for f in findings if f["check"] == "persistence"]
    masters = {f"127.0.0.1:{n.port}" for n in clean_cluster.masters()}
    assert {f["node"] for f in persistence} == masters and len(masters) == 3, findings
    assert all(f["severity"] == "error" for f in persistence) and code == 3
    cluster = [f for f in findings if f["check"] == "cluster"]
    assert [f["severity"] for f in cluster] == ["ok"], cluster
    assert "Redis Cluster of 3 master(s), queue in 6 partition(s)" in cluster[0]["message"]
    code, doc = doctor(clean_cluster, "--partitions", "2")
    cluster = [f for f in doc["findings"] if f["check"] == "cluster"]
    assert cluster[0]["severity"] == "info" and "1 master(s) hold no partition stream" in cluster[0]["message"]
