"""Flow executions: durable steps, suspend and resume, cancel, retries, and the keeper.

Define flows with ``Flow`` and ``@flow.step``; run them with ``plaita worker --flows MODULE``
(the handler is a ``FlowRunner``); start and steer them with ``FlowClient``.

The package is in wings (docs/architecture.md): ``model`` (definitions and the execution
document), ``runner`` (the worker handler), ``keeper`` (deadlines, orphans, schedules) and
``producer`` (``FlowClient``, cancel); ``io`` is the runner's one door to execution state, ``keeper_io``
the keeper's one door to Redis.
"""

from plaita.errors import ChildProcessDied, LeaseLostError, StepCancelled, StepTimeLimit
from plaita.flows.limit_control import LimitControl
from plaita.flows.model.context import Child, Resume, Sleep, Spawn, StepContext, Suspend
from plaita.flows.model.definition import Flow, FlowRegistry, NonRetryableError, RetryPolicy, Step, load_flows
from plaita.flows.model.execution import Execution
from plaita.flows.model.schedules import Schedule
from plaita.flows.producer.cancel import CancelOutcome
from plaita.flows.producer.client import DuplicateStart, FlowClient, WaitTimeout
from plaita.flows.runner.engine import FlowRunner

__all__ = [
    "CancelOutcome",
    "Child",
    "ChildProcessDied",
    "DuplicateStart",
    "Execution",
    "Flow",
    "FlowClient",
    "FlowRegistry",
    "FlowRunner",
    "LeaseLostError",
    "LimitControl",
    "NonRetryableError",
    "Resume",
    "RetryPolicy",
    "Schedule",
    "Sleep",
    "Spawn",
    "Step",
    "StepCancelled",
    "StepContext",
    "StepTimeLimit",
    "Suspend",
    "WaitTimeout",
    "load_flows",
]
