"""The path ``plaita.flows.cancel`` that docs before the wings named; the cancel lives in
``plaita.flows.producer.cancel`` and its outcome is exported as ``plaita.flows.CancelOutcome``."""

from plaita.flows.producer.cancel import CancelOutcome, request_cancel

__all__ = ["CancelOutcome", "request_cancel"]
