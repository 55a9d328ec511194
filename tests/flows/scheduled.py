"""A flow scheduled every second, for the end-to-end schedule test (``--flows tests.flows.scheduled``):
each run adds 1, exactly once (staged with its checkpoint), to ``plaita:test:tick:{tick_s}``."""

from __future__ import annotations

from plaita.flows import Flow, Schedule, StepContext

every_second = Flow("every-second", schedule=Schedule("* * * * * *", missed="all", params={"source": "test"}))


@every_second.step
def count(ctx: StepContext) -> dict[str, int]:
    tick_s = int(ctx.params["scheduled"]["tick_s"])
    ctx.stage_incr(ctx.key(f"plaita:test:tick:{tick_s}"))
    return {"tick_s": tick_s}
