"""The soak's flows, loaded by every soak worker (``--flows bench.soak_flows``).

Every step appends a start record and an end record to the history list on the *history*
Redis ($PLAITA_SOAK_HISTORY_URL), a server the nemesis never touches, so the checker sees
what really ran even while the queue's Redis is frozen or dead. A record is one JSON
object: kind (S start, E end), execution id, flow, step, attempt, worker (pid and
consumer), lease generation (read from the queue's Redis, None when that read failed),
wall time. Steps stage one INCR each (``soak:staged:{id}:{step}``): the checker reads those
counters to prove staged writes were applied exactly once.

Composition is in the mix too: a parent that fans out to ``CHILDREN`` children and joins them
(its join run records the outcomes it saw), a durable sleep (the sleeping step records its
deadline), and a schedule ticking every second (each tick's run records its tick).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import time
from typing import Any

import redis

from plaita.flows import Flow, Schedule, StepContext
from plaita.store.keyspace import DEFAULT

HISTORY_KEY = "soak:history"
STAGED_PREFIX = "soak:staged:"
#: A read of the lease generation must not hold a step up for long during a fault.
GENERATION_READ_TIMEOUT_S = 0.3

_clients: dict[str, redis.Redis] = {}


def _client(env: str, timeout_s: float) -> redis.Redis:
    url = os.environ[env]
    key = f"{env}:{url}"
    if key not in _clients:
        _clients[key] = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
    return _clients[key]


def _generation(execution_id: str) -> int | None:
    """The fencing generation of the execution's current lease (the holder's, normally ours)."""
    try:
        raw = _client("PLAITA_REDIS_URL", GENERATION_READ_TIMEOUT_S).get(DEFAULT.lease_key(execution_id))
    except redis.RedisError:
        return None
    if raw is None:
        return None
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    tail = text.rsplit(":", 1)[-1]
    return int(tail) if tail.isdigit() else None


def record(ctx: StepContext, kind: str, **extra: Any) -> None:
    """Append one history record; retried briefly (the history Redis is never faulted)."""
    entry = {
        "kind": kind,
        "id": ctx.execution_id,
        "flow": ctx.flow_id,
        "step": ctx.step,
        "attempt": ctx.attempt,
        "pid": os.getpid(),
        "worker": os.environ.get("PLAITA_CONSUMER_NAME", ""),
        "t": time.time(),
        **extra,
    }
    line = json.dumps(entry, separators=(",", ":"))
    for _ in range(20):
        try:
            _client("PLAITA_SOAK_HISTORY_URL", 2.0).rpush(HISTORY_KEY, line)
            return
        except redis.RedisError:
            time.sleep(0.05)


def _work(ctx: StepContext, *, fail_attempts: int = 0, **extra: Any) -> None:
    """The body of every step: record (with ``extra``), work a while (cancel-aware), stage one INCR, record."""
    record(ctx, "S", gen=_generation(ctx.execution_id), **extra)
    sleep_s = float(ctx.params.get("sleep_s", 0.05))
    ctx.cancel.wait(sleep_s)
    if ctx.attempt <= fail_attempts:
        record(ctx, "E", outcome="fail")
        raise RuntimeError(f"soak: planned failure of {ctx.step} attempt {ctx.attempt}")
    ctx.stage_incr(f"{STAGED_PREFIX}{ctx.execution_id}:{ctx.step}", ttl_s=86400)
    record(ctx, "E", outcome="ok")


# -- plain tasks: one step ---------------------------------------------------------------
plain = Flow("soak-plain")


@plain.step
def run(ctx: StepContext) -> None:
    _work(ctx)


# -- multi-step: four steps (also the target of cancels) ---------------------------------
multi = Flow("soak-multi")


@multi.step
def m1(ctx: StepContext) -> None:
    _work(ctx)


@multi.step
def m2(ctx: StepContext) -> None:
    _work(ctx)


@multi.step
def m3(ctx: StepContext) -> None:
    _work(ctx)


@multi.step
def m4(ctx: StepContext) -> None:
    _work(ctx)


# -- suspends until the producer resumes it ----------------------------------------------
suspending = Flow("soak-suspend")


@suspending.step
def before(ctx: StepContext) -> None:
    _work(ctx)


@suspending.step
def wait_event(ctx: StepContext) -> Any:
    if ctx.resume is None:
        record(ctx, "P")  # parked: suspended, no work done
        return ctx.suspend(timeout_s=3600)
    _work(ctx)
    return {"event": ctx.resume.data}


@suspending.step
def after(ctx: StepContext) -> None:
    _work(ctx)


# -- a step that fails twice and then succeeds (retried with backoff) --------------------
retrying = Flow("soak-retry")


@retrying.step
def r1(ctx: StepContext) -> None:
    _work(ctx)


@retrying.step(max_attempts=5, base_s=0.1, cap_s=0.5)
def flaky(ctx: StepContext) -> None:
    _work(ctx, fail_attempts=2)


@retrying.step
def r3(ctx: StepContext) -> None:
    _work(ctx)


# -- fan-out: a parent starts CHILDREN children, waits for all, then goes on -----------------
CHILDREN = 3
fanout = Flow("soak-fanout")
child = Flow("soak-child")


@fanout.step
def spawn(ctx: StepContext) -> Any:
    if ctx.children is None:
        record(ctx, "P")  # parked on its children, no work done
        sleep_s = ctx.params.get("sleep_s", 0.05)
        return ctx.spawn("soak-child", [{"sleep_s": sleep_s, "index": i} for i in range(CHILDREN)])
    _work(ctx, children=[[c.execution_id, c.status] for c in ctx.children])
    return None


@fanout.step
def after_join(ctx: StepContext) -> None:
    _work(ctx)


@child.step
def work(ctx: StepContext) -> None:
    _work(ctx)


# -- a durable sleep between two steps ----------------------------------------------------
sleeping = Flow("soak-sleep")


@sleeping.step
def nap(ctx: StepContext) -> Any:
    until_s = time.time() + float(ctx.params.get("nap_s", 1.0))
    _work(ctx, until=until_s)  # its staged INCR commits with the sleep's checkpoint
    return ctx.sleep_until(until_s)


@sleeping.step
def wake(ctx: StepContext) -> None:
    _work(ctx)


# -- a schedule ticking every second (started by the workers' keepers) ---------------------
#: ``missed="all"``: a tick a Redis outage or a keeper handover delayed is still started (the
#: checker expects every tick); ``grace_s`` short so the first pass does not start a minute of
#: ticks from before the soak.
ticking = Flow("soak-tick", schedule=Schedule("* * * * * *", missed="all", grace_s=5.0))


@ticking.step
def tick(ctx: StepContext) -> None:
    _work(ctx, tick_s=ctx.params["scheduled"]["tick_s"])


# -- a poison step: it kills whichever worker process runs it (the nemesis' ``poison_step``) ----
poison = Flow("soak-poison")


@poison.step
def bite(ctx: StepContext) -> None:
    record(ctx, "S", gen=_generation(ctx.execution_id))
    ctx.cancel.wait(0.05)
    kind = ctx.params.get("crash")
    if kind == "exit":
        os._exit(3)
    if kind == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    ctypes.string_at(0)  # segv: reads address 0


FLOWS = [plain, multi, suspending, retrying, fanout, child, sleeping, ticking, poison]
#: Steps that stage an INCR when they end well (checked for exactly-once), per flow.
STAGED_STEPS = {
    "soak-plain": ["run"],
    "soak-multi": ["m1", "m2", "m3", "m4"],
    "soak-suspend": ["before", "wait_event", "after"],
    "soak-retry": ["r1", "flaky", "r3"],
    "soak-fanout": ["spawn", "after_join"],
    "soak-child": ["work"],
    "soak-sleep": ["nap", "wake"],
    "soak-tick": ["tick"],
}
