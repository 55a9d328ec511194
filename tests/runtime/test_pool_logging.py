"""A task interrupted by a Redis failure is an expected condition: one warning line, no traceback."""

from __future__ import annotations

import logging

import pytest
import redis

from plaita.runtime.pool import HandlerPool
from plaita.runtime.settler import RETRY
from plaita.tasks import Task


def _pool(exc: BaseException) -> HandlerPool:
    def handler(_task: Task) -> None:
        raise exc

    return HandlerPool(handler, concurrency=1, max_deliveries=5, on_done=lambda _done: None)


def test_a_redis_failure_under_a_task_logs_one_line_without_a_traceback(caplog: pytest.LogCaptureFixture) -> None:
    """Found by the soak: every checkpoint cut by a Redis kill printed a full traceback at ERROR."""
    caplog.set_level(logging.DEBUG, logger="plaita.runtime.pool")
    outcome = _pool(redis.ConnectionError("Connection closed by server."))._call(Task("1-0", {}, 1))
    assert outcome.kind == RETRY
    (rec,) = caplog.records
    assert rec.levelno == logging.WARNING and rec.exc_info is None
    assert "Redis failure" in rec.getMessage() and "ConnectionError" in rec.getMessage()


def test_a_handler_bug_still_logs_its_traceback(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="plaita.runtime.pool")
    outcome = _pool(ValueError("a bug in the handler"))._call(Task("1-0", {}, 1))
    assert outcome.kind == RETRY
    (rec,) = caplog.records
    assert rec.levelno == logging.ERROR and rec.exc_info is not None
