"""The one exception root of plaita. Pure: never imports redis."""

from __future__ import annotations


class PlaitaError(Exception):
    """Root of every exception plaita raises on purpose."""

    #: Whether a step that raises it is retried under its retry policy. Most plaita errors are
    #: deliberate (a bad task, a refused call), so False; one that says "not yet" (a wait that
    #: timed out, a replica lagging) sets True. Decided per class here, never guessed from it.
    retryable: bool = False


class ConfigError(PlaitaError):
    """Raised when a flag, environment variable or URL cannot be used (exit code 2)."""


class BadTaskError(PlaitaError):
    """Raised when a stream entry cannot be a task: it goes to the DLQ with ``reason``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class HandlerLoadError(ConfigError):
    """Raised when ``--handler MODULE:CALLABLE`` cannot be imported or is not callable."""


class NotForThisWorker(PlaitaError):
    """Raised by a handler that cannot run a task another worker can (a flow it does not load,
    an execution checkpointed by a newer version of its flow).

    ``hand_back`` True: the worker gives the task back to the group at once, without charging a
    delivery (the ``TaskNotForThisWorker`` of older plaita handlers). False (the hand-back budget is
    spent): it is left pending like a failed delivery, so it cannot bounce between workers
    forever; ``reason`` is its DLQ reason should it reach ``--max-deliveries``. ``delay_s``: the
    hand-back waits that long (the handler's slot is free meanwhile), so a task that keeps coming
    back to this worker does not spend its budget in milliseconds.
    """

    def __init__(self, reason: str, *, hand_back: bool = True, delay_s: float = 0.0) -> None:
        super().__init__(reason)
        self.reason = reason
        self.hand_back = hand_back
        self.delay_s = delay_s
