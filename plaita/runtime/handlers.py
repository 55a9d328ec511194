"""Handlers that ship with plaita: examples, the demo's, and building blocks for tests.

A handler is any callable ``handler(task) -> None``; raise to leave the task pending for
redelivery, raise ``plaita.BadTaskError`` to dead-letter it at once.
"""

from __future__ import annotations

import importlib
import logging

from plaita.errors import HandlerLoadError
from plaita.tasks import Task

logger = logging.getLogger(__name__)


def noop(task: Task) -> None:
    """Completes every task at once (benchmarks)."""


def echo(task: Task) -> None:
    """Logs the task and completes it (``--handler plaita.runtime.handlers:echo``; a worker has no
    default handler: it needs ``--handler`` or ``--flows``)."""
    logger.info("task %s (delivery %d): %s", task.message_id, task.delivery_count, task.body)


def sleep(task: Task) -> None:
    """Sleeps ``params.sleep_s`` seconds (default 0.01), polling the cancel flag."""
    params = task.body.get("params") or {}
    duration_s = float(params.get("sleep_s", 0.01)) if isinstance(params, dict) else 0.01
    task.cancelled.wait(duration_s)


def load_handler(spec: str) -> object:
    """Import ``module:callable``; raises HandlerLoadError with a clear reason."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise HandlerLoadError(f"--handler must look like MODULE:CALLABLE, got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise HandlerLoadError(f"--handler {spec!r}: cannot import {module_name!r}: {exc}") from None
    except Exception as exc:  # the module itself raised while importing: still a configuration error
        raise HandlerLoadError(
            f"--handler {spec!r}: importing {module_name!r} raised {type(exc).__name__}: {exc}"
        ) from None
    target: object = module
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise HandlerLoadError(f"--handler {spec!r}: {module_name!r} has no attribute {attr!r}") from None
    if not callable(target):
        raise HandlerLoadError(f"--handler {spec!r} is not callable")
    return target


__all__ = ["echo", "load_handler", "noop", "sleep"]
