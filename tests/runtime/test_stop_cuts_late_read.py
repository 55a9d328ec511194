"""A stop that lands just before a blocking read goes out still stops the worker at once.

``request_stop`` cuts the owner's calls in progress, but a read the owner is about to send (the
stop flag already checked, its connection not yet taken from the pool) is not in progress yet:
it went out after the cut and blocked for its whole BLOCK (CI saw a 5.2 s stop with
``--read-block-ms 5000``). The stop is asked here from inside the read's call site, right before
the real XREADGROUP goes out (a FaultPlan hook around a real client), so the read always starts
after the first cut; the worker must still be gone well within a second, not after 5 s."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from tests.support.workers import FaultPlan, running_worker

pytestmark = pytest.mark.redis

BLOCK_MS = 5000
STOP_S = 1.0


class StopBeforeRead(FaultPlan):
    """Calls ``on_read`` once, on the owner's thread, just before a new-entries read goes out."""

    def __init__(self) -> None:
        super().__init__()
        self.on_read: Callable[[], None] | None = None
        self.stop_asked_at: float | None = None

    def delay_s(self, site: str) -> float:
        hook, self.on_read = (self.on_read, None) if site == "xreadgroup_new" else (None, self.on_read)
        if hook is not None:
            self.stop_asked_at = time.monotonic()
            hook()
        return super().delay_s(site)


def test_a_read_sent_just_after_the_stop_is_cut_too(redis_url: str) -> None:
    plan = StopBeforeRead()
    with running_worker(redis_url, plan=plan, read_block_ms=BLOCK_MS) as rw:
        plan.on_read = rw.worker.request_stop  # the next read: asked to stop, then sent
        rw.thread.join(BLOCK_MS / 1000 + 3)
        assert not rw.thread.is_alive(), "the worker did not stop"
        stopped_at = time.monotonic()
    assert plan.stop_asked_at is not None
    assert stopped_at - plan.stop_asked_at < STOP_S, stopped_at - plan.stop_asked_at
