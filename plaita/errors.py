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


class LeaseLostError(PlaitaError):
    """The worker lost an execution's lease mid-run (a renewal failed, or a newer holder fenced
    it out): nothing more is written; the task stays pending and the lease's successor
    continues from the last checkpoint. Expected after an outage longer than the lease: the
    pool logs it as one line, never as a handler's failure with a traceback."""


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


class StepTimeLimit(PlaitaError):
    """A step ran past its time limit (``@flow.step(time_limit_s=...)``, ``--step-time-limit-s``).
    In ``--pool process`` its child process was killed; in threads the step ran to its end and its
    result was discarded. A failed attempt: the step's retry policy applies."""

    retryable = True


class ChildProcessDied(PlaitaError):
    """The child process running a step or a handler (``--pool process``) died: ``os._exit``, a
    signal (SIGKILL from the OOM killer), a segfault. Only that attempt fails; ``exit_code`` is
    the process's (negative: the signal's number)."""

    retryable = True

    def __init__(self, reason: str, exit_code: int | None = None) -> None:
        super().__init__(reason)
        self.exit_code = exit_code

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (str(self), self.exit_code))


class StepCancelled(PlaitaError):
    """The child process of a step (``--pool process``) was killed because its execution was
    cancelled, passed its deadline or lost its lease while the step ran; the runner ends the
    execution ``cancelled`` (or stops, the lease lost), it is no failure of the step."""


class StepRaised(PlaitaError):
    """Stands in for an exception of a step or handler that cannot cross the process boundary
    (``--pool process``: it does not pickle, or does not unpickle); ``kind`` keeps the original
    class name for the execution's ``error``. Retried like the exception it replaces would be."""

    retryable = True

    def __init__(self, kind: str, text: str) -> None:
        super().__init__(f"{kind}: {text}")
        self.kind = kind

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.kind, str(self).partition(": ")[2]), self.__dict__)  # notes too
