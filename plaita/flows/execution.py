"""The path ``plaita.flows.execution`` that docs before the wings named; the execution document
lives in ``plaita.flows.model.execution`` and is exported as ``plaita.flows.Execution``."""

from plaita.flows.model.execution import BadExecution, Execution

__all__ = ["BadExecution", "Execution"]
