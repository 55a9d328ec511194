"""Flow definitions: a named, ordered list of steps, their retry policy, and loading them.

Pure: no Redis. A 3-step flow::

    flow = Flow("signup")

    @flow.step
    def create(ctx): return {"user": ctx.params["name"]}

    @flow.step(max_attempts=5)
    async def send_email(ctx): ...

    @flow.step
    def wait_confirm(ctx): return ctx.suspend(timeout_s=3600) if ctx.resume is None else None
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import math
import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

from plaita.errors import BadTaskError, ConfigError, PlaitaError
from plaita.flows.model.schedules import Schedule, schedule_of

StepFn = Callable[[Any], Any]
#: A hook: called with the ``Execution`` (plaita.flows.model.execution) a terminal checkpoint wrote.
Hook = Callable[[Any], Any]
#: Hook kinds: the terminal status they follow, or ``end`` for any of them.
HOOK_KINDS = ("completed", "error", "cancelled", "end")

#: Attempts of a step before the execution ends in ``error`` (the first run counts).
DEFAULT_MAX_ATTEMPTS = 3
#: The longest ``Flow.retention_s`` (as the longest TTL a checkpoint gives: ten years).
MAX_RETENTION_S = 10 * 365 * 24 * 3600
DEFAULT_RETRY_BASE_S = 0.5
DEFAULT_RETRY_CAP_S = 30.0


class NonRetryableError(PlaitaError):
    """Raised by a step whose failure no retry can fix: the execution ends in ``error`` at once."""


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with jitter: attempt n (1-based) waits about base * 2**(n-1), capped."""

    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    base_s: float = DEFAULT_RETRY_BASE_S
    cap_s: float = DEFAULT_RETRY_CAP_S
    jitter: float = 0.5
    #: Exceptions that end the execution at once (NonRetryableError always does).
    non_retryable: tuple[type[BaseException], ...] = ()

    def __post_init__(self) -> None:
        if self.max_attempts < 1 or self.base_s < 0 or self.cap_s < self.base_s or not 0 <= self.jitter <= 1:
            raise ConfigError("retry policy needs max_attempts >= 1, 0 <= base_s <= cap_s, 0 <= jitter <= 1")

    def delay_s(self, failed_attempt: int, rng: random.Random) -> float:
        nominal = min(self.cap_s, self.base_s * float(2 ** min(failed_attempt - 1, 62)))
        return nominal * (1.0 - self.jitter * rng.random())

    def retryable(self, exc: BaseException) -> bool:
        """Whether ``exc`` earns another attempt: not one of ``non_retryable``, and a plaita
        error only when its class says so (``PlaitaError.retryable``: most are deliberate)."""
        if isinstance(exc, self.non_retryable):
            return False
        return exc.retryable if isinstance(exc, PlaitaError) else True


@dataclass(frozen=True)
class Step:
    name: str
    fn: StepFn
    retry: RetryPolicy
    #: Seconds one attempt may run (None: the worker's ``--step-time-limit-s``, if any). Hard in
    #: ``--pool process`` (the child is killed), soft in threads (the result is discarded).
    time_limit_s: float | None = None
    #: A sync step run on the worker's event loop itself, not on a thread (``Flow.step``'s ``inline``).
    inline: bool = False
    #: ``fn`` is an ``async def`` (asked once here, not at every run of the step).
    is_async: bool = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "is_async", inspect.iscoroutinefunction(self.fn))


def check_time_limit_s(value: Any, where: str) -> float | None:
    """``value`` as a time limit in seconds (None: none); ConfigError unless finite and > 0."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        raise ConfigError(f"{where}: time_limit_s must be a finite number of seconds > 0 or None, got {value!r}")
    return float(value)


@dataclass
class Flow:
    """A named, ordered list of steps.

    ``version`` declares compatibility: an execution started under another fingerprint (steps
    renamed, added or reordered since) continues only if it was started with ``version`` or a
    version listed in ``compatible_with``; otherwise its resume is refused with an error state.
    """

    flow_id: str
    version: str | None = None
    compatible_with: Sequence[str] = ()
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    steps: list[Step] = field(default_factory=list)
    #: Hooks by kind (``HOOK_KINDS``): register them with ``on_complete``, ``on_error``, ``on_end``.
    hooks: dict[str, list[Hook]] = field(default_factory=dict, repr=False, compare=False)
    #: Started by the keeper on every tick (``Schedule``, or a cron string: UTC, missed ticks skipped).
    schedule: Schedule | str | None = None
    #: At most this many executions run at once across every worker (``plaita.flows.runner.limits``);
    #: None = no limit. A suspended execution holds no slot.
    max_concurrent: int | None = None
    #: At most this many starts per second across every worker (a token bucket holding one
    #: second's worth, at least 1); None = no limit. Resumes are not counted.
    max_starts_per_s: float | None = None
    #: ``(N, period_s)``: no window of ``period_s`` seconds holds more than N starts, across every
    #: worker (a sliding log of start times, so the first window lets N through when N wait);
    #: None = no limit. Resumes are not counted. May be combined with ``max_starts_per_s``.
    rate_limit: tuple[int, float] | None = None
    #: At most this many executions with the same ``concurrency_key`` run at once across every
    #: worker (one charge per customer at a time); a start whose key is busy parks until that
    #: key's slot frees, in start order per key, and other keys' starts run meanwhile. None = no
    #: limit. Not combined with ``max_concurrent`` (a start would wait in two queues).
    max_concurrent_per_key: int | None = None
    #: The key of ``max_concurrent_per_key``: the name of a param (``"customer_id"``), or a
    #: function of the params returning the key (``lambda p: p["account"]["id"]``); the key is
    #: its ``str()``. A start without it (a missing param, a function that raises) is dead-lettered.
    concurrency_key: str | Callable[[dict[str, Any]], Any] | None = field(default=None, compare=False)
    #: Seconds an ended execution of this flow is kept (its document, events and index entry),
    #: 0 = for ever; None = the worker's default, 7 days (``plaita.flows.retention``).
    retention_s: int | None = None

    def __post_init__(self) -> None:
        if not self.flow_id:
            raise ConfigError("a flow needs a non-empty flow_id")
        try:
            self.schedule = schedule_of(self.schedule)
        except ConfigError as exc:
            raise ConfigError(f"flow {self.flow_id!r}: {exc}") from None
        limit, rate = self.max_concurrent, self.max_starts_per_s
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise ConfigError(f"flow {self.flow_id!r}: max_concurrent must be an int >= 1 or None, got {limit!r}")
        if rate is not None and (
            isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 < rate < math.inf
        ):
            raise ConfigError(f"flow {self.flow_id!r}: max_starts_per_s must be a number > 0 or None, got {rate!r}")
        if self.rate_limit is not None:
            self.rate_limit = _rate_limit(self.flow_id, self.rate_limit)
        _check_per_key(self)
        keep = self.retention_s
        if keep is not None and (
            isinstance(keep, bool) or not isinstance(keep, int) or not 0 <= keep <= MAX_RETENTION_S
        ):
            raise ConfigError(
                f"flow {self.flow_id!r}: retention_s must be an int of seconds in 0..{MAX_RETENTION_S} or None, "
                f"got {keep!r}"
            )

    def limited(self, *, start: bool) -> bool:
        """True when a task of this flow (a start, or not) has a fleet-wide limit to pass
        (``plaita.flows.runner.limits``): asked by the runner before it takes a slot."""
        return (
            self.max_concurrent is not None or self.max_concurrent_per_key is not None or (start and self.limits_starts)
        )

    def key_of(self, params: Any) -> str:
        """The concurrency key of an execution with ``params`` (``concurrency_key``); BadTaskError
        when it has none."""
        how = self.concurrency_key
        try:
            value = how(params) if callable(how) else params[how]
        except Exception as exc:
            raise BadTaskError(
                f"flow {self.flow_id!r}: no concurrency key in the params ({type(exc).__name__}: {exc})"
            ) from None
        if value is None:
            raise BadTaskError(f"flow {self.flow_id!r}: the concurrency key is None")
        return str(value)

    @property
    def limits_starts(self) -> bool:
        """True when a start of this flow waits for a start rate (``max_starts_per_s``, ``rate_limit``)."""
        return self.max_starts_per_s is not None or self.rate_limit is not None

    @property
    def start_burst(self) -> float:
        """Starts the rate limit lets through at once after a quiet spell: one second's worth."""
        return max(1.0, float(self.max_starts_per_s or 0.0))

    # Hooks run in the worker that wrote the terminal checkpoint, right after it, at most once
    # per execution (docs/flows.md, "Hooks"); they are not part of the fingerprint.
    def on_complete(self, fn: Hook) -> Hook:
        """Register ``fn(execution)`` for executions of this flow that completed (decorator)."""
        return self.add_hook("completed", fn)

    def on_error(self, fn: Hook) -> Hook:
        """Register ``fn(execution)`` for executions of this flow that ended in ``error``."""
        return self.add_hook("error", fn)

    def on_end(self, fn: Hook) -> Hook:
        """Register ``fn(execution)`` for every end: completed, error or cancelled."""
        return self.add_hook("end", fn)

    def add_hook(self, kind: str, fn: Hook) -> Hook:
        if kind not in HOOK_KINDS or not callable(fn):
            raise ConfigError(f"flow {self.flow_id!r}: a hook is a callable for one of {', '.join(HOOK_KINDS)}")
        self.hooks.setdefault(kind, []).append(fn)
        return fn

    def hooks_for(self, status: str) -> list[Hook]:
        """The hooks to call after a checkpoint ended an execution in ``status`` (a terminal one)."""
        return [*self.hooks.get(status, ()), *self.hooks.get("end", ())]

    @overload
    def step(self, fn: StepFn, /) -> StepFn: ...

    @overload
    def step(
        self,
        fn: None = None,
        /,
        *,
        name: str | None = None,
        retry: RetryPolicy | None = None,
        time_limit_s: float | None = None,
        inline: bool = False,
        **policy: Any,
    ) -> Callable[[StepFn], StepFn]: ...

    def step(
        self,
        fn: StepFn | None = None,
        /,
        *,
        name: str | None = None,
        retry: RetryPolicy | None = None,
        time_limit_s: float | None = None,
        inline: bool = False,
        **policy: Any,
    ) -> StepFn | Callable[[StepFn], StepFn]:
        """Append a step (decorator, bare or with ``name=``, ``retry=``, ``time_limit_s=``,
        ``inline=`` or RetryPolicy fields).

        ``inline=True`` (sync steps only): the step runs on the worker's event loop itself
        instead of on a thread, which saves the thread hop (most of what a sync step costs the
        worker beyond an ``async def`` one). Only for plain, short functions that never block
        (no I/O, no sleep, no lock, no long computation): while an inline step runs, every other
        execution of that worker waits, its lease renewals and reads too. It keeps everything
        else of a sync step: what it raises is a failed attempt (its retry policy), it runs in a
        copy of the context (its contextvars do not leak), ``ctx.cancelled`` is set as usual.
        With ``--pool process`` it runs in a child like any step; a worker running flows on
        handler threads calls it there, as any sync step. Refused with ``time_limit_s``
        (ConfigError): nothing can interrupt a step on the loop, so a step that needs a limit
        is not one to run inline."""
        where = f"flow {self.flow_id!r}"
        limit_s = check_time_limit_s(time_limit_s, where)
        if not isinstance(inline, bool):
            raise ConfigError(f"{where}: inline takes True or False, not {inline!r}")
        if inline and limit_s is not None:
            raise ConfigError(
                f"{where}: inline=True cannot take time_limit_s: an inline step runs on the worker's event "
                "loop, where nothing can interrupt it; run a step that needs a time limit on a thread "
                "(without inline) or in --pool process"
            )

        def add(f: StepFn) -> StepFn:
            step_name = name or getattr(f, "__name__", "")
            if not step_name or step_name in self.step_names:
                raise ConfigError(f"{where}: step name {step_name!r} is empty or used twice")
            if inline and inspect.iscoroutinefunction(f):
                raise ConfigError(
                    f"{where}: step {step_name!r}: inline=True is for sync steps "
                    "(an async def step runs on the loop already)"
                )
            chosen = retry or (_replace(self.retry, policy) if policy else self.retry)
            self.steps.append(Step(step_name, f, chosen, limit_s, inline=inline))
            return f

        return add(fn) if fn is not None else add

    @property
    def step_names(self) -> list[str]:
        return [s.name for s in self.steps]

    @property
    def fingerprint(self) -> str:
        """Changes whenever steps are renamed, added, removed or reordered."""
        return hashlib.sha256("\n".join(self.step_names).encode("utf-8")).hexdigest()[:16]

    def index_of(self, step_name: str) -> int | None:
        for i, s in enumerate(self.steps):
            if s.name == step_name:
                return i
        return None

    def lineage(self, earlier: Iterable[Any] = ()) -> list[str]:
        """The versions an execution checkpointed by this definition has been at, or is newer
        than: ``earlier`` (what it had), the versions declared compatible, and this one. A worker
        whose version is in an execution's lineage but is not its version is the older one."""
        out: list[str] = []
        for v in (*earlier, *self.compatible_with, self.version):
            if isinstance(v, str) and v not in out:
                out.append(v)
        return out

    def accepts_version(self, version: str | None) -> bool:
        """True if an execution started with ``version`` may run on this definition."""
        return (
            self.version is not None
            and version is not None
            and (version == self.version or version in self.compatible_with)
        )


def _replace(policy: RetryPolicy, changes: dict[str, Any]) -> RetryPolicy:
    try:
        return RetryPolicy(**{**policy.__dict__, **changes})
    except TypeError as exc:
        raise ConfigError(f"unknown step option: {exc}") from None


def _check_per_key(flow: Flow) -> None:
    """``max_concurrent_per_key`` and ``concurrency_key`` come together, without ``max_concurrent``."""
    limit, how = flow.max_concurrent_per_key, flow.concurrency_key
    if limit is None and how is None:
        return
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ConfigError(f"flow {flow.flow_id!r}: max_concurrent_per_key must be an int >= 1, got {limit!r}")
    if not (callable(how) or (isinstance(how, str) and how)):
        raise ConfigError(
            f"flow {flow.flow_id!r}: concurrency_key must be a param name or a function of the params, got {how!r}"
        )
    if flow.max_concurrent is not None:
        raise ConfigError(f"flow {flow.flow_id!r}: max_concurrent_per_key cannot be combined with max_concurrent")


def _rate_limit(flow_id: str, value: Any) -> tuple[int, float]:
    """``rate_limit`` checked: a pair (N >= 1 an int, period_s > 0 a finite number)."""
    try:
        n, period_s = value
    except (TypeError, ValueError):
        raise ConfigError(f"flow {flow_id!r}: rate_limit must be (N, period_s) or None, got {value!r}") from None
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"flow {flow_id!r}: rate_limit's N must be an int >= 1, got {n!r}")
    if isinstance(period_s, bool) or not isinstance(period_s, int | float) or not 0 < period_s < math.inf:
        raise ConfigError(f"flow {flow_id!r}: rate_limit's period_s must be a number > 0, got {period_s!r}")
    return n, float(period_s)


class FlowRegistry:
    """Flows by id."""

    def __init__(self, flows: Iterable[Flow] = ()) -> None:
        self._flows: dict[str, Flow] = {}
        for f in flows:
            self.add(f)

    def add(self, flow: Flow) -> None:
        if not flow.steps:
            raise ConfigError(f"flow {flow.flow_id!r} has no steps")
        known = self._flows.get(flow.flow_id)
        if known is not None and known is not flow:
            raise ConfigError(f"flow {flow.flow_id!r} is defined twice")
        self._flows[flow.flow_id] = flow

    def get(self, flow_id: Any) -> Flow | None:
        return self._flows.get(flow_id) if isinstance(flow_id, str) else None

    def __iter__(self) -> Iterator[Flow]:
        return iter(self._flows.values())

    def __len__(self) -> int:
        return len(self._flows)


def load_flows(modules: Iterable[str]) -> FlowRegistry:
    """Import ``modules`` and collect their flows: a module-level ``FLOWS`` list if present,
    else every ``Flow`` attribute. ConfigError when a module cannot be imported or has none."""
    registry = FlowRegistry()
    for name in modules:
        try:
            module = importlib.import_module(name)
        except Exception as exc:  # any import-time failure of user code is a configuration error
            raise ConfigError(f"--flows {name!r}: cannot import: {type(exc).__name__}: {exc}") from None
        declared = getattr(module, "FLOWS", None)
        found = list(declared) if declared is not None else [v for v in vars(module).values() if isinstance(v, Flow)]
        if not found or not all(isinstance(f, Flow) for f in found):
            raise ConfigError(f"--flows {name!r}: no Flow objects found (define them at module level or in FLOWS)")
        for f in found:
            registry.add(f)
    return registry
