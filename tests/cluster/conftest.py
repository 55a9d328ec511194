"""The cluster tier: one private Redis Cluster (3 masters, 3 replicas) per test session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from plaita.config import Settings
from plaita.flows.producer.client import FlowClient
from plaita.store.streams.partitioned import open_queue
from tests.support.lease_workers import QUEUE
from tests.support.redis_cluster import NO_CLI_REASON, ClusterServers, ClusterUnavailable, redis_cli_missing


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[ClusterServers]:
    """Shared by the whole session: a test that faults it leaves it whole again (or ``clean_cluster`` heals it)."""
    if redis_cli_missing():
        pytest.skip(NO_CLI_REASON)
    cluster = ClusterServers(masters=3, replicas_per_master=1)
    try:
        cluster.start()
    except ClusterUnavailable as exc:
        pytest.skip(f"no Redis Cluster on this server: {exc}")
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def clean_cluster(redis_cluster: ClusterServers) -> Iterator[ClusterServers]:
    """The shared cluster, whole (every node up) and empty (FLUSHALL on each of its masters);
    the clients the test took from it are closed after it."""
    redis_cluster.heal()
    redis_cluster.flushall()
    try:
        yield redis_cluster
    finally:
        redis_cluster.close_clients()


@pytest.fixture
def cluster_flows(clean_cluster: ClusterServers, monkeypatch: pytest.MonkeyPatch) -> Iterator[FlowClient]:
    """A producer on the clean cluster's queue in 6 partitions (``flows.queue``), the test flows'
    own client (``PLAITA_TEST_REDIS_URL``) pointed at the cluster too; the queue closed after."""
    monkeypatch.setenv("PLAITA_TEST_REDIS_URL", clean_cluster.url)
    q = open_queue(Settings(redis_url=clean_cluster.url, queue_name=QUEUE, consumer_name="p", partitions=6))
    try:
        yield FlowClient(q)
    finally:
        q.close()
