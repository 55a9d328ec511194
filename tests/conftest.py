"""Fixtures: a private redis-server per test session (never port 6379), flushed per test."""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import redis

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.support.redis_server import RedisServer  # noqa: E402

if TYPE_CHECKING:
    from tests.flows.support import Harness


@pytest.fixture(autouse=True)
def _collect_garbage_after_each_test() -> Iterator[None]:
    """Collect garbage once the test's own fixtures are torn down (an autouse fixture of the
    root conftest is set up first, so it is torn down last), so a socket or pipe the test
    dropped unclosed in a reference cycle fails *that* test (warnings are errors) instead of
    whichever test runs when the collector happens to find it."""
    yield
    gc.collect()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One shared private server for the non-destructive tests."""
    with RedisServer(persist=False) as server:
        yield server


@pytest.fixture
def redis_url(redis_server: RedisServer) -> Iterator[str]:
    """URL of the shared private server, flushed before each test."""
    client = redis_server.client()
    client.flushall()
    client.close()
    yield redis_server.url


@pytest.fixture
def rclient(redis_url: str) -> Iterator[redis.Redis]:
    """A plain client on the shared private server (decode_responses=True)."""
    c = redis.Redis.from_url(redis_url, decode_responses=True, socket_timeout=5)
    yield c
    c.close()


@pytest.fixture
def bclient(redis_url: str) -> Iterator[redis.Redis]:
    """A plain client on the shared private server with bytes replies, as plaita's own clients."""
    c = redis.Redis.from_url(redis_url, socket_timeout=5)
    yield c
    c.close()


@pytest.fixture
def private_redis() -> Iterator[RedisServer]:
    """A server of the test's own, with persistence, for tests that fault it."""
    with RedisServer(persist=True) as server:
        yield server


@pytest.fixture
def h(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    """The real flow engine over the test flows (``tests.flows.flowdefs``), fed tasks by hand
    (``tests.flows.support.Harness``); the flows' own writes go to the private server too. A test
    module with flows of its own defines its own ``h``, which overrides this one."""
    from tests.flows.support import harness  # imported on use: most tests run no flows

    monkeypatch.setenv("PLAITA_TEST_REDIS_URL", redis_url)
    with harness(redis_url) as opened:
        yield opened
