"""A flow of three fleet-wide slots for ``bench/parking.py`` (``--flows bench.parkdefs``): it records
the order its runs begin. Kept apart from ``bench.flowdefs``, whose workers would otherwise sweep
its parked starts too (one script call every ttl/3, noise in the command counts of other benches)."""

from __future__ import annotations

import time

from bench.flowdefs import _client
from plaita.flows import Flow, StepContext

slots3 = Flow("bench-slots3", max_concurrent=3)
#: Where ``slots3`` records each run's execution id as it begins.
SLOTS3_ORDER = "plaita:bench:slots3:order"


@slots3.step
def occupy(ctx: StepContext) -> None:
    _client().rpush(SLOTS3_ORDER, ctx.execution_id)
    time.sleep(0.05)


FLOWS = [slots3]
