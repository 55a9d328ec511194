"""Jobs for ``ProcessPool`` tests (importable by its children: a job is pickled by module path)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

from plaita.runtime.procchild import ChildServices


class NeedsTwo(Exception):
    """An exception that pickles but does not unpickle (its __init__ wants two arguments)."""

    def __init__(self, a: int, b: int) -> None:
        super().__init__(f"{a} and {b}")


@dataclass(frozen=True)
class Job:
    """``what``: pid (return the child's pid), ask (a live call, returned), raise_two (NeedsTwo),
    wait_cancel (wait up to ``seconds`` for the cancel flag, return whether it came), exit
    (``os._exit(3)``), none (return None: a plain success, sent back with the next result), sleep
    (``seconds``, deaf to the cancel flag)."""

    what: str
    seconds: float = 0.0

    def __call__(self, services: ChildServices) -> Any:
        if self.what == "pid":
            return os.getpid()
        if self.what == "ask":
            return services.request("publish", "name", 1)
        if self.what == "raise_two":
            raise NeedsTwo(1, 2)
        if self.what == "wait_cancel":
            return services.cancel.wait(self.seconds)
        if self.what == "exit":
            os._exit(3)
        if self.what == "none":
            return None
        if self.what == "sleep":
            time.sleep(self.seconds)
            return None
        raise ValueError(self.what)
