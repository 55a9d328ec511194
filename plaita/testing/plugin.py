"""The pytest fixtures of ``plaita.testing`` (loaded by ``pytest -p plaita.testing``, whose
``pytest_plugins`` names this module): the only part of the kit that needs pytest."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from plaita.store.embedded import EmbeddedServer
from plaita.testing.clock import TestClock
from plaita.testing.runner import FlowTestRunner


@pytest.fixture(scope="session")
def plaita_server() -> Iterator[EmbeddedServer]:
    """One private server for the test session (each xdist worker process has its own)."""
    with EmbeddedServer() as server:
        yield server


@pytest.fixture
def plaita_clock() -> Iterator[TestClock]:
    """plaita's wall clock for this test: real time until the test (or ``flow_runner``) moves it."""
    with TestClock() as clock:
        yield clock


@pytest.fixture
def flow_runner(plaita_server: EmbeddedServer, plaita_clock: TestClock) -> Iterator[FlowTestRunner]:
    """Runs the test's executions to the end on the private server, flushed first."""
    plaita_server.flush()
    with FlowTestRunner(plaita_server.url, plaita_clock) as runner:
        yield runner
    # What the worker left unclosed is found now, in this test, not in whichever test runs
    # when the collector happens to (a warning is an error in most test configurations).
    gc.collect()
