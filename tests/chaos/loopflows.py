"""Flows for the loop-connection chaos tests (``--flows tests.chaos.loopflows``): ``relay``
alternates ``async def`` steps (on the worker's loop) and sync steps (on its threads), each
pausing ``params.pause_s`` and staging one INCR (``plaita:test:staged:{eid}:{step}``), so
checkpoints are on the loop connection all the time and each must commit exactly once."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from plaita.flows import Flow, StepContext

STEPS = ["a1", "s1", "a2", "s2", "a3", "s3"]

relay = Flow("relay")


def _stage(ctx: StepContext) -> dict[str, Any]:
    ctx.stage_incr(ctx.key(f"plaita:test:staged:{ctx.execution_id}:{ctx.step}"))
    return {ctx.step: 1}


@relay.step
async def a1(ctx: StepContext) -> dict[str, Any]:
    await asyncio.sleep(float(ctx.params["pause_s"]))
    return _stage(ctx)


@relay.step
def s1(ctx: StepContext) -> dict[str, Any]:
    time.sleep(float(ctx.params["pause_s"]))  # the step's work
    return _stage(ctx)


@relay.step
async def a2(ctx: StepContext) -> dict[str, Any]:
    await asyncio.sleep(float(ctx.params["pause_s"]))
    return _stage(ctx)


@relay.step
def s2(ctx: StepContext) -> dict[str, Any]:
    time.sleep(float(ctx.params["pause_s"]))  # the step's work
    return _stage(ctx)


@relay.step
async def a3(ctx: StepContext) -> dict[str, Any]:
    await asyncio.sleep(float(ctx.params["pause_s"]))
    return _stage(ctx)


@relay.step
def s3(ctx: StepContext) -> dict[str, Any]:
    time.sleep(float(ctx.params["pause_s"]))  # the step's work
    return _stage(ctx)


FLOWS = [relay]
