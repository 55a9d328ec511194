"""What a step receives (``StepContext``) and what it may return (``Suspend``). Pure: no Redis."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from plaita.clock import wall_s
from plaita.errors import PlaitaError
from plaita.flows.model.validate import check_timeout_s, check_wait_name
from plaita.store.executions.staged import MAX_SECONDS, STAGE_OPS, Staged, check_amount, check_ttl_s
from plaita.store.keyspace import hash_tag
from plaita.tasks import CancelFlag

#: Staged writes may not touch execution bookkeeping: the checkpoint owns those keys.
_RESERVED_PREFIXES = ("plaita:execution:", "plaita:executions:", "plaita:start-dedup:")
#: Nor any tenant's (``plaita:<tenant>:execution:…``): a step of one tenant must not reach into
#: another's executions, nor the list of tenants.
_RESERVED_TENANT = re.compile(r"plaita:[^:]*:(?:execution|executions|start-dedup):|plaita:tenants$")


@dataclass(frozen=True)
class Resume:
    """How a suspended step was resumed: ``type`` is event, continue, retry or timeout;
    ``wait_for`` the name (or message topic) of the wait it ended, None for a plain wait."""

    type: str
    data: Any = None
    wait_for: str | None = None


class Receiving(PlaitaError):
    """Raised by ``ctx.recv`` when no message for its topic is at hand: the runner turns it into a
    suspension waiting for that topic (``Suspend(timeout_s, wait_for=topic)``), and the step runs
    again when a message (or the timeout) comes. Let it through: a step that catches it and goes
    on has not waited. Its args are (topic, timeout_s), so it pickles back from a pool child."""

    def __init__(self, topic: str, timeout_s: float | None) -> None:
        super().__init__(topic, timeout_s)
        self.topic, self.timeout_s = topic, timeout_s

    def __str__(self) -> str:
        return f"waiting for a message on {self.topic!r} (ctx.recv; a step must not catch this)"

    @property
    def suspension(self) -> Suspend:
        return Suspend(self.timeout_s, wait_for=self.topic)


@dataclass(frozen=True)
class Suspend:
    """Returned by a step (``return ctx.suspend(...)``): checkpoint and wait for a resume.

    The same step runs again when the execution is resumed, with ``ctx.resume`` set.
    ``timeout_s`` is None (no timeout) or finite seconds in [0, 10 years]; ``wait_for`` names the
    resumes this wait takes (``plaita.flows.model.inbox``); ValueError otherwise.
    """

    timeout_s: float | None = None
    wait_for: str | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        object.__setattr__(self, "timeout_s", check_timeout_s(self.timeout_s))
        check_wait_name(self.wait_for)


@dataclass(frozen=True)
class Sleep(Suspend):
    """Returned by a step (``return ctx.sleep(s)``): a durable sleep. The step's state, staged
    writes and result (None) are checkpointed; at the deadline the keeper resumes the execution
    with ``continue`` and the NEXT step runs (or the one named with ``ctx.goto``; the execution
    completes when the sleeping step was the last). ``until_s`` (epoch seconds) is the deadline
    when given, else now + ``timeout_s`` (ValueError unless finite seconds in [0, 10 years])."""

    until_s: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.until_s is None:
            if self.timeout_s is None:
                raise ValueError("sleep needs a number of seconds")
            return
        until_s = self.until_s
        if isinstance(until_s, bool) or not isinstance(until_s, int | float) or not math.isfinite(until_s):
            raise ValueError(f"sleep_until needs a finite epoch time in seconds, got {until_s!r}")
        if until_s - wall_s() > MAX_SECONDS:
            raise ValueError(f"sleep_until {until_s!r} is more than {MAX_SECONDS} s (10 years) away")
        object.__setattr__(self, "until_s", float(until_s))


@dataclass(frozen=True)
class Spawn(Suspend):
    """Returned by a step (``return ctx.spawn(flow, [params, ...])``): start one child execution
    of ``flow_id`` per params and suspend until every one is terminal; the step then runs again
    with ``ctx.children`` set (``plaita.flows.runner.children``)."""

    flow_id: str = ""
    params: tuple[dict[str, Any], ...] = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.flow_id, str) or not self.flow_id:
            raise ValueError("spawn: the child flow id must be a non-empty string")
        for p in self.params:
            if not isinstance(p, dict):
                raise ValueError(f"spawn: each child's params must be a dict (got {type(p).__name__})")
            json.dumps(p, allow_nan=False)  # ValueError/TypeError in the step, not at the checkpoint


@dataclass(frozen=True)
class Child:
    """How one child execution ended, as its parent's step sees it (``ctx.children``)."""

    execution_id: str
    status: str
    #: The return value of its last step (completed), else None.
    result: Any = None
    #: Its ``error`` field (status error), else None.
    error: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.status == "completed"


class StepContext:
    """One run of one step.

    ``state`` is the execution's state (mutable: changes are checkpointed with the step);
    a dict the step returns is merged into it. ``cancel`` is set when a cancel was requested
    or the worker lost the lease: a long step should poll ``cancelled`` and return early.
    """

    def __init__(
        self,
        *,
        execution_id: str,
        flow_id: str,
        step: str,
        params: dict[str, Any],
        state: dict[str, Any],
        results: dict[str, Any],
        resume: Resume | None,
        attempt: int,
        cancel: CancelFlag,
        slot_tag: str = "",
        deadline_at: float | None = None,
        publisher: Callable[[str, Any], None] | None = None,
    ) -> None:
        self.execution_id = execution_id
        self.flow_id = flow_id
        self.step = step
        self.params = params
        self.state = state
        self.results = results
        self.resume = resume
        self.attempt = attempt
        self.cancel = cancel
        #: The whole execution's deadline (epoch seconds) or None; past it ``cancel`` is set.
        self.deadline_at = deadline_at
        #: The execution's hash tag with partitions ("" without): a staged key must carry it.
        self.slot_tag = slot_tag
        self.next_step: str | None = None
        self.staged: list[Staged] = []
        self._publisher = publisher
        self._received = False

    @property
    def cancelled(self) -> bool:
        return self.cancel.is_set()

    def suspend(self, timeout_s: float | None = None, *, wait_for: str | None = None) -> Suspend:
        """The value to return to suspend; past ``timeout_s`` the keeper resumes with ``timeout``.
        With ``wait_for`` only resumes addressed to that name (``FlowClient.resume(...,
        wait_for=...)``) end the wait, and one that came earlier, while the execution was
        elsewhere, is taken at once (``plaita.flows.model.inbox``). ValueError unless ``timeout_s`` is
        None or finite seconds in [0, 10 years] and ``wait_for`` None or a non-empty name."""
        return Suspend(timeout_s, wait_for=wait_for)

    def recv(self, topic: str, timeout_s: float | None = None) -> Any:
        """The data of the oldest message sent to ``topic`` (``FlowClient.send``), or None when
        ``timeout_s`` passed first. A recv is a suspension waiting for ``topic``
        (``ctx.suspend(wait_for=topic)``): with no message at hand it raises ``Receiving``, the
        execution suspends (no thread, no lease), and this step runs again from its top when the
        message comes; this call then returns it. One message per run of a step: a second recv
        in the same run is a ValueError (receive the next one in the next step, or
        ``ctx.goto(ctx.step)`` to run this one again). ValueError for a bad topic or timeout."""
        if check_wait_name(topic, "topic") is None:
            raise ValueError("recv needs a topic")
        check_timeout_s(timeout_s)
        if self._received:
            raise ValueError(
                f"step {self.step!r} already received a message in this run: one recv per run of a step "
                f"(receive {topic!r} in the next step, or ctx.goto({self.step!r}) to run this one again)"
            )
        got = self.resume
        if got is not None and got.wait_for is not None:
            if got.wait_for != topic:
                raise ValueError(
                    f"step {self.step!r} was resumed by its wait for {got.wait_for!r} but receives {topic!r} first: "
                    f"one recv per run of a step"
                )
            if got.type != "retry":  # an operator's retry of the wait: wait again
                self._received = True
                return got.data if got.type == "event" else None  # timeout or continue: no message
        raise Receiving(topic, timeout_s)

    def sleep(self, seconds: float) -> Sleep:
        """The value to return to sleep durably (``return ctx.sleep(3 * 86400)``): no thread and
        no lease held; after ``seconds`` the next step runs. ValueError unless ``seconds`` is
        finite in [0, 10 years]."""
        if seconds is None:
            raise ValueError("sleep needs a number of seconds, got None")
        return Sleep(seconds)

    def sleep_until(self, epoch_s: float) -> Sleep:
        """``sleep`` until the epoch time ``epoch_s`` (a time already past wakes at once).
        ValueError unless finite and at most 10 years away."""
        return Sleep(None, until_s=epoch_s)

    def spawn(self, flow_id: str, params: list[dict[str, Any]]) -> Spawn:
        """The value to return to start one child execution of ``flow_id`` per item of
        ``params`` and wait, holding no thread and no lease, until all are terminal. The step
        then runs again with ``ctx.children`` (one ``Child`` per item, in order). A re-run of the
        step (redelivered, retried, resumed) starts no second set: child ids are derived from
        this execution's id, the step and how many joins the step has had."""
        return Spawn(None, flow_id, tuple(params))

    def start_child(self, flow_id: str, params: dict[str, Any] | None = None) -> Spawn:
        """``spawn`` of one child."""
        return self.spawn(flow_id, [params or {}])

    @property
    def children(self) -> list[Child] | None:
        """After a ``spawn`` joined: each child's outcome, in the order spawned; else None."""
        if self.resume is None or self.resume.type != "child" or not isinstance(self.resume.data, list):
            return None
        return [
            Child(str(c.get("execution_id")), str(c.get("status")), c.get("result"), c.get("error"))
            for c in self.resume.data
        ]

    def publish(self, name: str, value: Any) -> None:
        """Write ``value`` (strict JSON, at most 64 KiB) under ``name`` now, not with the
        checkpoint: ``FlowClient.events`` / ``get_event`` and ``plaita executions show`` see it
        while the step still runs (the last value per name wins; at most 100 names). One fenced
        Redis call (it blocks for that round trip, in an ``async def`` step too). ValueError for
        a bad name or value; LeaseLostError when the worker lost the execution's lease."""
        if self._publisher is None:
            raise RuntimeError("this step context has no publisher (it is not run by a FlowRunner)")
        self._publisher(name, value)

    def set_progress(self, value: Any) -> None:
        """``publish("progress", value)``: say how far the step is (a fraction, counts, text)."""
        self.publish("progress", value)

    def goto(self, step_name: str) -> None:
        """Run ``step_name`` next instead of the following step (branches and loops)."""
        self.next_step = step_name

    # Every staged value is checked here, where the step can see the error: a checkpoint
    # writes all of its staged writes or none (a key of the wrong type refuses the whole step).
    def stage(self, key: str, value: Any, *, ttl_s: int = 0) -> None:
        """SET ``key`` atomically with this step's checkpoint: it happens exactly once.
        ``ttl_s``: 0 (none) to 10 years; ``value``: a str as is, else strict JSON."""
        self._stage("set", key, value, ttl_s)

    def stage_incr(self, key: str, amount: int = 1, *, ttl_s: int = 0) -> None:
        """INCRBY ``key`` with this step's checkpoint (``amount`` a signed 64-bit integer)."""
        self._stage("incrby", key, amount, ttl_s)

    def stage_push(self, key: str, value: Any, *, ttl_s: int = 0) -> None:
        """RPUSH ``value`` onto ``key`` with this step's checkpoint."""
        self._stage("rpush", key, value, ttl_s)

    def key(self, name: str) -> str:
        """``name`` in this execution's hash slot (``name:{tag}`` with partitions, else ``name``):
        what a staged key must be on Redis Cluster, where one script touches one slot."""
        return f"{name}:{self.slot_tag}" if self.slot_tag else name

    def _stage(self, op: str, key: str, value: Any, ttl_s: int) -> None:
        assert op in STAGE_OPS
        if not isinstance(key, str) or not key or key.startswith(_RESERVED_PREFIXES) or _RESERVED_TENANT.match(key):
            raise ValueError(f"cannot stage a write to {key!r}: execution keys belong to the checkpoint")
        if self.slot_tag and hash_tag(key) != self.slot_tag:
            raise ValueError(
                f"cannot stage a write to {key!r}: with partitions a staged key must carry the execution's hash "
                f"tag {self.slot_tag} (use ctx.key({key!r}))"
            )
        try:
            ttl = check_ttl_s(ttl_s)
            text = self._text(op, value)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"cannot stage {op} {key!r}: {exc}") from None
        self.staged.append(Staged(op, key, text, ttl))

    @staticmethod
    def _text(op: str, value: Any) -> str:
        if op == "incrby":
            return str(check_amount(value))
        if isinstance(value, str):
            return value
        try:
            return json.dumps(value, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{type(value).__name__} is not strict JSON ({exc})") from None
