"""Fixtures of the flow tests that run real worker processes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from plaita.flows.producer.client import FlowClient
from tests.support.lease_workers import QUEUE


@pytest.fixture
def flows(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[FlowClient]:
    """A producer on the test queue, built as a user would (``FlowClient.from_url``); the test
    flows' own Redis writes (``tests.flows.flowdefs``) go to the same private server."""
    monkeypatch.setenv("PLAITA_TEST_REDIS_URL", redis_url)
    with FlowClient.from_url(redis_url, queue_name=QUEUE, socket_timeout_s=5.0) as client:
        yield client


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    """A plain client of the private server with bytes replies, as the worker's client has."""
    c = redis.Redis.from_url(redis_url, socket_timeout=5)
    yield c
    c.close()
