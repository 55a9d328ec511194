"""OpenTelemetry spans of tasks and steps, and the W3C ``traceparent`` a task body carries.

Optional: ``opentelemetry-api`` (the ``plaita[otel]`` extra) is imported on first use. When it is
not installed, or no tracer provider is configured (the API's default proxy), ``Tracing.active``
returns None and the runner takes its untraced path: no span, no context, no allocation.

One trace per execution. A producer (``FlowClient``, ``plaita enqueue``, a spawning step) puts
its context in the body's ``traceparent``; the execution keeps the first one it sees as its
origin (the document's ``traceparent``: written by any worker, traced or not). Every later task
of it (a resume, a retry, a redelivery to another worker, the keeper's wake-ups) is a child of
that origin, so the web request that started an order shows every step it ever ran; a resume's
own producer becomes a link. An execution started without one takes its first traced task's
span as its origin. A ``traceparent`` that is not W3C is ignored (never a reason to refuse a task).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from plaita.errors import BadTaskError, LeaseLostError, NotForThisWorker
from plaita.flows.model import bodies as model
from plaita.flows.model.execution import Execution
from plaita.tasks import Task
from plaita.version import __version__

#: A W3C trace context header: version, trace id, parent span id, flags (later versions may append).
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
#: Longest ``traceparent`` looked at (W3C bounds the header; a body field is not a header).
MAX_TRACEPARENT_CHARS = 512
#: Task outcomes of a task whose handler raised (others are the execution's status, or ``noop``).
_RAISED_OUTCOMES: tuple[tuple[type[BaseException], str, bool], ...] = (
    (NotForThisWorker, "handed_over", False),
    (BadTaskError, "refused", True),
    (LeaseLostError, "lease_lost", True),
)

#: The ``opentelemetry.trace`` module, None until first looked for, False when not installed. What
#: reads it directly runs only once ``Tracing.active`` found a tracer, so it is loaded by then.
_api: Any = None
#: The ``opentelemetry.context`` module, once ``_api`` is.
_context: Any = None


def parse_traceparent(value: Any) -> str | None:
    """``value`` as a version-00 ``traceparent`` if it is a valid W3C one, else None."""
    if not isinstance(value, str) or len(value) > MAX_TRACEPARENT_CHARS:
        return None
    m = _TRACEPARENT.fullmatch(value)
    if m is None:
        return None
    version, trace_id, span_id, flags, rest = m.groups()
    if version == "ff" or (version == "00" and rest) or not int(trace_id, 16) or not int(span_id, 16):
        return None
    return f"00-{trace_id}-{span_id}-{flags}"


def otel_api() -> Any | None:
    """``opentelemetry.trace``, or None when the API is not installed (looked for once)."""
    global _api, _context
    if _api is None:
        try:
            from opentelemetry import context, trace
        except ImportError:
            _api = False
        else:
            _api, _context = trace, context
    return _api or None


def _remote_context(traceparent: str | None) -> Any:
    """An OpenTelemetry context whose parent is ``traceparent`` (a valid one), else an empty one."""
    api = _api
    if traceparent is None:
        return _context.Context()
    _, trace_id, span_id, flags = traceparent.split("-")
    remote = api.SpanContext(
        int(trace_id, 16), int(span_id, 16), is_remote=True, trace_flags=api.TraceFlags(int(flags, 16))
    )
    return api.set_span_in_context(api.NonRecordingSpan(remote), _context.Context())


def traceparent_of(span: Any) -> str | None:
    """The ``traceparent`` naming ``span`` (None for an invalid, non-recording one)."""
    sc = span.get_span_context()
    return f"00-{sc.trace_id:032x}-{sc.span_id:016x}-{sc.trace_flags:02x}" if sc.is_valid else None


def current_traceparent() -> str | None:
    """The ``traceparent`` of the caller's current span (a web request's), if any."""
    api = otel_api()
    return None if api is None else traceparent_of(api.get_current_span())


class Tracing:
    """Where spans come from: ``provider`` (an SDK ``TracerProvider``), else the global one.

    Asking the API for the global provider costs microseconds (it looks up an environment
    variable), so an unconfigured one is asked again only every ``RECHECK_S``: a provider set
    while the worker runs is used from then on."""

    #: How long "no tracer provider" is believed before the API is asked again.
    RECHECK_S = 1.0

    __slots__ = ("_provider", "_recheck_at_s", "tracer")

    def __init__(self, provider: Any = None) -> None:
        self._provider = provider
        self._recheck_at_s = 0.0
        #: Set once a real provider is seen (a global provider is set once, never unset).
        self.tracer: Any = None

    def active(self) -> Any | None:
        """The tracer to make spans with, or None: tracing is off, the caller does nothing."""
        if self.tracer is not None:
            return self.tracer
        if _api is False:
            return None  # not installed: known for good
        now_s = time.monotonic()
        if now_s < self._recheck_at_s:
            return None
        self._recheck_at_s = now_s + self.RECHECK_S
        return self._resolve()

    def _resolve(self) -> Any | None:
        api = otel_api()
        if api is None:
            return None
        provider = self._provider if self._provider is not None else api.get_tracer_provider()
        if isinstance(provider, (api.ProxyTracerProvider, api.NoOpTracerProvider)):
            return None  # nothing configured: the API would hand out non-recording spans
        tracer = provider.get_tracer("plaita", __version__)
        if isinstance(tracer, api.NoOpTracer):  # OTEL_SDK_DISABLED
            return None
        self.tracer = tracer
        return tracer


#: The producers' tracer source: the global provider (FlowClient, the CLI).
PRODUCERS = Tracing()


class TaskTrace:
    """The ``plaita.task`` span of one task (kind CONSUMER) and the ``plaita.step`` spans under it.

    Built when the task starts; the span itself opens once admission knows the execution
    (``open``: backdated to the start), so its parent can be the execution's origin.
    """

    def __init__(self, tracer: Any, task: Task, destination: str) -> None:
        self._tracer, self.task, self._destination = tracer, task, destination
        self._started_ns = time.time_ns()
        self._body_traceparent = parse_traceparent(task.body.get(model.TRACEPARENT))
        self.span: Any = None
        self._token: Any = None
        self._step: Any = None
        self._step_outcome: str | None = None
        self.outcome: str | None = None

    def open(self, origin: str | None, flow_id: str | None) -> None:
        """Start the task span under ``origin`` (the execution's trace), else the body's context;
        the body's context is linked when it is not the parent. Current until ``close``."""
        api, task = _api, self.task
        parent = origin or self._body_traceparent
        links = []
        if self._body_traceparent is not None and self._body_traceparent != parent:
            producer = api.get_current_span(_remote_context(self._body_traceparent)).get_span_context()
            links.append(api.Link(producer, {"plaita.link": "producer"}))
        attributes: dict[str, Any] = {
            "messaging.system": "redis",
            "messaging.destination.name": self._destination,
            "messaging.operation.type": "process",
            "messaging.message.id": task.message_id,
            "plaita.execution_id": task.execution_id,
            "plaita.task.type": str(task.body.get("type")),
            "plaita.delivery_count": task.delivery_count,
        }
        if task.body.get("type") == "resume":
            attributes["plaita.resume_type"] = str(task.body.get("resume_type", "continue"))
        if isinstance(task.body.get("tenant_id"), str):
            attributes["plaita.tenant_id"] = task.body["tenant_id"]
        if flow_id is not None:
            attributes["plaita.flow"] = flow_id
        self.span = self._tracer.start_span(
            "plaita.task",
            context=_remote_context(parent),
            kind=api.SpanKind.CONSUMER,
            attributes=attributes,
            links=links,
            start_time=self._started_ns,
        )
        self._token = _context.attach(api.set_span_in_context(self.span))

    def origin(self) -> str | None:
        """What an execution without an origin takes: the body's context, else this span's."""
        if self._body_traceparent is not None:
            return self._body_traceparent
        return None if self.span is None else traceparent_of(self.span)

    def close(self, raised: BaseException | None = None) -> None:
        """End the task span (opening it first if admission never did) with its outcome."""
        if self.span is None:
            self.open(None, None)
        outcome, error = self.outcome or "noop", False
        if raised is not None:
            outcome, error = next(((o, e) for t, o, e in _RAISED_OUTCOMES if isinstance(raised, t)), ("raised", True))
        self.span.set_attribute("plaita.outcome", outcome)
        if error:
            self._failed(self.span, raised)
        _context.detach(self._token)
        self.span.end()

    @contextmanager
    def step(self, flow_id: str, step: str, attempt: int) -> Iterator[None]:
        """A ``plaita.step <name>`` span around one run of a step and its checkpoint; current while
        it runs, so the step's own spans (an HTTP call) nest under it."""
        api = _api
        attributes = {
            "plaita.execution_id": self.task.execution_id,
            "plaita.flow": flow_id,
            "plaita.step": step,
            "plaita.attempt": attempt,
        }
        span = self._tracer.start_span(f"plaita.step {step}", attributes=attributes)
        self._step, self._step_outcome = span, None
        try:
            with api.use_span(span, record_exception=False, set_status_on_exception=False):
                yield
        except BaseException as exc:  # a lost lease or a refused checkpoint: the step ended with it
            span.set_attribute("plaita.outcome", self._step_outcome or "lease_lost")
            self._failed(span, exc)
            raise
        else:
            span.set_attribute("plaita.outcome", self._step_outcome or "ok")
        finally:
            self._step = None
            span.end()

    def step_finished(self, outcome: str, raised: BaseException | None) -> None:
        """The step returned (``ok``, ``suspended``) or raised (``failed``)."""
        self._step_outcome = outcome
        if raised is not None and self._step is not None:
            self._failed(self._step, raised)

    @staticmethod
    def _failed(span: Any, exc: BaseException | None) -> None:
        api = _api
        if exc is not None:
            span.record_exception(exc)
        span.set_status(api.Status(api.StatusCode.ERROR, None if exc is None else type(exc).__name__))


def joined(trace: TaskTrace | None, execution: Execution, flow_id: str, body: Mapping[str, Any]) -> Execution:
    """Open the task's span under the execution's trace; an execution without one takes the
    body's ``traceparent`` (else this task's span) as its origin, written by its next checkpoint."""
    if trace is not None:
        trace.open(execution.traceparent, flow_id)
    if execution.traceparent is not None:
        return execution
    origin = trace.origin() if trace is not None else parse_traceparent(body.get(model.TRACEPARENT))
    return execution if origin is None else execution.traced(origin)


@contextmanager
def producing(bodies: list[dict[str, Any]], destination: str, *, parent: str | None = None) -> Iterator[None]:
    """Around an enqueue of ``bodies``: each body without a valid ``traceparent`` gets one. With a
    tracer configured, that of a ``plaita.enqueue`` span (kind PRODUCER) under ``parent`` or the
    caller's current span; without, the caller's context (or ``parent``) as it is."""
    tracer = PRODUCERS.active()
    if tracer is None:
        _carry(bodies, parent or current_traceparent())
        yield
        return
    api = _api
    span = tracer.start_span(
        "plaita.enqueue",
        context=_remote_context(parent) if parent is not None else None,
        kind=api.SpanKind.PRODUCER,
        attributes=_producer_attributes(bodies, destination),
    )
    _carry(bodies, traceparent_of(span))
    with api.use_span(span, end_on_exit=True):
        yield


def _carry(bodies: list[dict[str, Any]], traceparent: str | None) -> None:
    if traceparent is None:
        return
    for body in bodies:
        if parse_traceparent(body.get(model.TRACEPARENT)) is None:
            body[model.TRACEPARENT] = traceparent


def _producer_attributes(bodies: list[dict[str, Any]], destination: str) -> Mapping[str, Any]:
    attributes: dict[str, Any] = {
        "messaging.system": "redis",
        "messaging.destination.name": destination,
        "messaging.operation.type": "send",
    }
    if len(bodies) == 1:
        body = bodies[0]
        attributes["plaita.task.type"] = str(body.get("type"))
        for name, field in (("plaita.execution_id", "execution_id"), ("plaita.flow", "flow_id")):
            if isinstance(body.get(field), str):
                attributes[name] = body[field]
    else:
        attributes["messaging.batch.message_count"] = len(bodies)
    return attributes
