"""plaita: a Redis Streams worker daemon that never dies of a Redis fault.

The public face, everything a program needs without reaching into the packages::

    from plaita import Flow, FlowClient, Settings, StepContext, run_worker

    signup = Flow("signup")

    @signup.step
    def create(ctx: StepContext) -> dict:
        return {"user": ctx.params["name"]}

    run_worker(Settings(redis_url="redis://localhost:6379/0"), flows=[signup])   # until SIGTERM

    with FlowClient.from_url("redis://localhost:6379/0") as flows:                 # a producer
        flows.wait(flows.start("signup", {"name": "ann"}), timeout_s=30)

Only the exceptions are imported with the package: every other name is loaded on first use
(PEP 562), so ``import plaita`` (and ``import plaita.fsm``) never pulls in redis or the worker.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from plaita.errors import (
    BadTaskError,
    ChildProcessDied,
    ConfigError,
    HandlerLoadError,
    PlaitaError,
    StepCancelled,
    StepTimeLimit,
)
from plaita.version import __version__

if TYPE_CHECKING:
    from plaita.config import Settings, TlsFiles
    from plaita.flows import (
        Flow,
        FlowRegistry,
        FlowRunner,
        LeaseLostError,
        NonRetryableError,
        Resume,
        RetryPolicy,
        Schedule,
        Step,
        StepContext,
        Suspend,
        load_flows,
    )
    from plaita.flows.producer.client import DuplicateStart, ExecutionNotFound, FlowClient, WaitTimeout
    from plaita.flows.producer.listing import ExecutionPage, ExecutionRow, StepRow
    from plaita.ops.service import WorkerService, build_worker, run_worker, start_worker
    from plaita.tasking import TaskFailed, TaskRegistry, TaskResultTimeout, UnknownTaskResult
    from plaita.tasking.client import TaskClient, enqueue
    from plaita.tasks import Task

#: Public name -> the module it is loaded from on first use.
_LAZY: dict[str, str] = {
    "Settings": "plaita.config",
    "TlsFiles": "plaita.config",
    "Task": "plaita.tasks",
    **dict.fromkeys(
        (
            "Flow",
            "FlowRegistry",
            "FlowRunner",
            "LeaseLostError",
            "NonRetryableError",
            "Resume",
            "RetryPolicy",
            "Schedule",
            "Step",
            "StepContext",
            "Suspend",
            "load_flows",
        ),
        "plaita.flows",
    ),
    **dict.fromkeys(
        ("DuplicateStart", "ExecutionNotFound", "FlowClient", "WaitTimeout"), "plaita.flows.producer.client"
    ),
    **dict.fromkeys(("ExecutionPage", "ExecutionRow", "StepRow"), "plaita.flows.producer.listing"),
    **dict.fromkeys(("WorkerService", "build_worker", "run_worker", "start_worker"), "plaita.ops.service"),
    **dict.fromkeys(("TaskFailed", "TaskRegistry", "TaskResultTimeout", "UnknownTaskResult"), "plaita.tasking"),
    **dict.fromkeys(("TaskClient", "enqueue"), "plaita.tasking.client"),
}

__all__ = [
    "BadTaskError",
    "ChildProcessDied",
    "ConfigError",
    "DuplicateStart",
    "ExecutionNotFound",
    "ExecutionPage",
    "ExecutionRow",
    "Flow",
    "FlowClient",
    "FlowRegistry",
    "FlowRunner",
    "HandlerLoadError",
    "LeaseLostError",
    "NonRetryableError",
    "PlaitaError",
    "Resume",
    "RetryPolicy",
    "Schedule",
    "Settings",
    "Step",
    "StepCancelled",
    "StepContext",
    "StepRow",
    "StepTimeLimit",
    "Suspend",
    "Task",
    "TaskClient",
    "TaskFailed",
    "TaskRegistry",
    "TaskResultTimeout",
    "TlsFiles",
    "UnknownTaskResult",
    "WaitTimeout",
    "WorkerService",
    "__version__",
    "build_worker",
    "enqueue",
    "load_flows",
    "run_worker",
    "start_worker",
]


def __getattr__(name: str) -> Any:
    """Load a public name's module on first use and keep the name here (later uses are plain lookups)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'plaita' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
