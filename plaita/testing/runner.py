"""Run a flow's executions to the end, in this process, against a private server.

``FlowTestRunner`` starts a real flow worker with an embedded keeper (``plaita.start_worker``,
the function ``plaita worker --flows --keeper`` runs) on threads of this process the first time
it is asked to start something, and drives executions through a ``FlowClient``. Nothing of
Redis is imitated: what a test sees is what a deployment does.

Time is a ``TestClock``: ``run`` and ``run_until_done`` move it ahead to the deadline of the
execution's sleep or suspension timeout, or past the backoff of a failed attempt, as soon as
the execution waits for nothing else, so a 3-day ``ctx.sleep`` ends in milliseconds.
``advance`` moves it by hand (a timeout a test wants to reach, a schedule's tick).
"""

from __future__ import annotations

import importlib
import random
import secrets
import time
from collections.abc import Iterable
from types import ModuleType
from typing import Any

from plaita import Settings, WorkerService, start_worker
from plaita.flows import Flow, FlowClient, Schedule, WaitTimeout, load_flows
from plaita.tasking import TaskRegistry
from plaita.tasking.client import TaskClient
from plaita.testing.clock import TestClock

#: How long ``run``, ``run_until_done`` and the waits wait unless told: generous for a loaded CI
#: machine, short enough that a stuck test says so within the test timeout.
DEFAULT_TIMEOUT_S = 20.0
#: How often the waits read the execution.
POLL_S = 0.01
#: How long stopping waits for the worker's graceful stop before it stops it at once.
STOP_TIMEOUT_S = 10.0
#: The statuses an execution ends in.
TERMINAL_STATUSES = frozenset({"completed", "error", "cancelled"})
#: The worker's embedded keeper lease: its full passes (schedules) come every half of it.
KEEPER_LEASE_TTL_S = 1.0
#: The worker's reclaim pass, which moves due delayed starts onto the stream: a start delayed three
#: days runs within this once the clock is moved.
RECLAIM_INTERVAL_S = 0.25

FlowSource = Flow | ModuleType | str


class FlowTestRunner:
    """A flow worker, a keeper and a client on one private server, for one test."""

    __test__ = False  # a helper, not a test class pytest should collect

    def __init__(
        self, redis_url: str, clock: TestClock, *, queue_name: str | None = None, concurrency: int = 4
    ) -> None:
        self.redis_url = redis_url
        self.clock = clock
        self.queue_name = queue_name or f"plaita-test-{secrets.token_hex(3)}"
        self.concurrency = concurrency
        self._flows: dict[str, Flow] = {}
        self._service: WorkerService | None = None
        self._client: FlowClient | None = None
        #: The queue of named tasks (``load_tasks``): a queue of its own, as ``plaita dev --tasks``.
        self.tasks_queue = f"{self.queue_name}:tasks"
        self._tasks_service: WorkerService | None = None
        self._task_client: TaskClient | None = None
        #: (execution id, history length) of failed attempts whose backoff was already skipped.
        self._skipped: set[tuple[str, int]] = set()
        #: Resume ids this runner sent, by execution, not yet seen applied: the clock is not moved
        #: over a wait whose resume or message is still on its way (it would time the wait out).
        self._in_flight: dict[str, set[str]] = {}

    # -- the worker ------------------------------------------------------------------------
    def load(self, *sources: FlowSource) -> FlowTestRunner:
        """Add flows the worker runs: ``Flow`` objects, modules, or module names (their ``FLOWS``
        or every ``Flow`` they hold, as ``plaita worker --flows``). A worker already running is
        restarted with them."""
        added = False
        for flow in _flows_of(sources):
            if self._flows.get(flow.flow_id) is not flow:
                self._flows[flow.flow_id] = flow
                added = True
        if added and self._service is not None:
            self._stop_worker()
        return self

    @property
    def flow_client(self) -> FlowClient:
        """The ``FlowClient`` of the runner's queue (opened on first use; closed by ``close``)."""
        if self._client is None:
            self._client = FlowClient.from_url(self.redis_url, queue_name=self.queue_name, socket_timeout_s=5.0)
        return self._client

    def _worker(self) -> WorkerService:
        if self._service is None:
            if not self._flows:
                raise ValueError("no flows to run: pass a Flow to start/run, or call load(module) first")
            settings = self._settings(self.queue_name, "test", keeper_lease_ttl_s=KEEPER_LEASE_TTL_S)
            self._service = start_worker(settings, flows=list(self._flows.values()), keeper=True)
        return self._service

    def _settings(self, queue_name: str, name_prefix: str, **more: Any) -> Settings:
        """A kit worker's settings on ``queue_name``: a fresh consumer name, the runner's
        concurrency, a short registry TTL and heartbeat (a test's fleet shows in seconds), and a
        short reclaim pass (it moves delayed starts and tasks, and named tasks' retries, when due)."""
        return Settings(
            redis_url=self.redis_url,
            queue_name=queue_name,
            consumer_name=f"{name_prefix}-{secrets.token_hex(3)}",
            concurrency=self.concurrency,
            reclaim_interval_s=RECLAIM_INTERVAL_S,
            registry_ttl_s=5.0,
            heartbeat_interval_s=1.0,
            **more,
        )

    def load_tasks(self, tasks: TaskRegistry | str) -> TaskClient:
        """Run a named-task worker (``plaita worker --tasks``) for ``tasks`` (a registry, or a
        module name holding one) on ``tasks_queue``; returns the ``TaskClient`` of that queue."""
        if self._tasks_service is not None:
            raise ValueError("a task worker already runs: one registry per runner")
        self._tasks_service = start_worker(self._settings(self.tasks_queue, "test-tasks"), tasks=tasks)
        return self.task_client

    @property
    def task_client(self) -> TaskClient:
        """The ``TaskClient`` of ``tasks_queue`` (opened on first use; closed by ``close``)."""
        if self._task_client is None:
            self._task_client = TaskClient.from_url(self.redis_url, queue_name=self.tasks_queue)
        return self._task_client

    def _stop_worker(self) -> None:
        service, self._service = self._service, None
        _stop(service)

    def close(self) -> None:
        """Stop the workers (gracefully, at once past ``STOP_TIMEOUT_S``) and close the clients."""
        try:
            self._stop_worker()
            tasks, self._tasks_service = self._tasks_service, None
            _stop(tasks)
        finally:
            for client in (self._client, self._task_client):
                if client is not None:
                    client.close()
            self._client = self._task_client = None

    def __enter__(self) -> FlowTestRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- steering --------------------------------------------------------------------------
    def start(self, flow: Flow | str, params: dict[str, Any] | None = None, **options: Any) -> str:
        """Start an execution (``FlowClient.start``'s options: ``execution_id``, ``dedup_key``,
        ``deadline_s``, ...) with the worker running; returns its id."""
        if isinstance(flow, Flow):
            self.load(flow)
        self._worker()
        return self.flow_client.start(flow.flow_id if isinstance(flow, Flow) else flow, params, **options)

    def run(
        self,
        flow: Flow | str,
        params: dict[str, Any] | None = None,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        advance: bool = True,
        **options: Any,
    ) -> dict[str, Any]:
        """``start`` then ``run_until_done``: the execution's document once it has ended."""
        return self.run_until_done(self.start(flow, params, **options), timeout_s=timeout_s, advance=advance)

    def run_until_done(
        self, execution_id: str, *, timeout_s: float = DEFAULT_TIMEOUT_S, advance: bool = True
    ) -> dict[str, Any]:
        """Wait until the execution ends and return its document; with ``advance`` the clock jumps
        to its sleep's or timeout's deadline, and past a failed attempt's backoff, as soon as it
        waits for that. An execution that waits for an event nothing sends fails fast:
        ``WaitTimeout`` says what it waits for."""
        self._worker()
        deadline_s = time.monotonic() + timeout_s
        while True:
            doc = self.flow_client.get(execution_id)
            if doc is not None and doc.get("status") in TERMINAL_STATUSES:
                return doc
            if advance and doc is not None:
                self._advance_for(execution_id, doc)
            if time.monotonic() >= deadline_s:
                raise WaitTimeout(f"execution {execution_id} {describe_wait(doc)} after {timeout_s:g} s")
            time.sleep(POLL_S)

    def wait_for_status(
        self, execution_id: str, *statuses: str, timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> dict[str, Any]:
        """The execution's document once its status is one of ``statuses`` (no clock moves)."""
        self._worker()
        deadline_s = time.monotonic() + timeout_s
        while True:
            doc = self.flow_client.get(execution_id)
            if doc is not None and doc.get("status") in statuses:
                return doc
            if time.monotonic() >= deadline_s:
                raise WaitTimeout(f"execution {execution_id} {describe_wait(doc)}, not {'/'.join(statuses)}")
            time.sleep(POLL_S)

    def wait_until_waiting(
        self, execution_id: str, wait_for: str | None = None, *, timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> dict[str, Any]:
        """The document once the execution is suspended (in the wait named ``wait_for``, if given)."""
        deadline_s = time.monotonic() + timeout_s
        while True:
            left_s = max(0.0, deadline_s - time.monotonic())
            doc = self.wait_for_status(execution_id, "suspended", *TERMINAL_STATUSES, timeout_s=left_s)
            if doc.get("status") in TERMINAL_STATUSES:
                raise WaitTimeout(f"execution {execution_id} ended {doc.get('status')} instead of waiting")
            if wait_for is None or (doc.get("suspension") or {}).get("wait_for") == wait_for:
                return doc
            if time.monotonic() >= deadline_s:
                raise WaitTimeout(f"execution {execution_id} {describe_wait(doc)}, not for {wait_for!r}")
            time.sleep(POLL_S)

    def resume(self, execution_id: str, data: Any = None, **options: Any) -> Any:
        """``FlowClient.resume`` (``resume_type`` "event" by default, ``wait_for``, ``resume_id``).
        Until the execution took it, ``run_until_done`` moves no clock over its wait."""
        options.setdefault("resume_id", f"test:{secrets.token_hex(8)}")
        sent = self.flow_client.resume(execution_id, data=data, **options)
        self._in_flight.setdefault(execution_id, set()).add(options["resume_id"])
        return sent

    def send(self, execution_id: str, topic: str, data: Any = None, **options: Any) -> Any:
        """``FlowClient.send``: a message a step takes with ``ctx.recv(topic)`` (``idempotency_key``).
        Until the execution took it, ``run_until_done`` moves no clock over its wait."""
        key = options.setdefault("idempotency_key", f"test:{secrets.token_hex(8)}")
        sent = self.flow_client.send(execution_id, topic, data, **options)
        self._in_flight.setdefault(execution_id, set()).add(f"msg:{topic}:{key}")
        return sent

    def cancel(self, execution_id: str) -> Any:
        return self.flow_client.cancel(execution_id)

    def retry(self, execution_id: str, **options: Any) -> Any:
        return self.flow_client.retry(execution_id, **options)

    def get(self, execution_id: str) -> dict[str, Any] | None:
        return self.flow_client.get(execution_id)

    def events(self, execution_id: str) -> dict[str, Any]:
        return self.flow_client.events(execution_id)

    # -- time ------------------------------------------------------------------------------
    def advance(self, seconds: float) -> float:
        """Move the clock ahead by ``seconds``; the keeper acts on what came due within about a
        quarter of a second (timeouts, wakes, deadlines) or at its next pass (schedules)."""
        return self.clock.advance(seconds)

    def tick(self, flow: Flow, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> str:
        """Move the clock to ``flow``'s next scheduled tick and return the id of the execution the
        keeper starts for it (``schedule:FLOW:TICK``), once it exists."""
        schedule = flow.schedule
        if not isinstance(schedule, Schedule):  # a Flow turns a bare cron string into a Schedule
            raise ValueError(f"flow {flow.flow_id!r} has no schedule")
        self.load(flow)
        self._worker()
        tick_s = schedule.next_tick_s(self.clock())
        self.clock.advance_to(tick_s)
        execution_id = f"schedule:{flow.flow_id}:{tick_s}"
        deadline_s = time.monotonic() + timeout_s
        while self.flow_client.get(execution_id) is None:
            if time.monotonic() >= deadline_s:
                raise WaitTimeout(f"no execution for {flow.flow_id}'s tick {tick_s} after {timeout_s:g} s")
            time.sleep(POLL_S)
        return execution_id

    def _advance_for(self, execution_id: str, doc: dict[str, Any]) -> None:
        """Move the clock to what the execution waits for, if that is a time (and no resume this
        runner sent is still on its way to it)."""
        in_flight = self._in_flight.get(execution_id)
        if in_flight:
            in_flight -= set(doc.get("applied_resumes") or ())
            if in_flight:
                return
        status, suspension = doc.get("status"), doc.get("suspension") or {}
        waiting = doc.get("waiting") or {}
        if status == "queued" and waiting.get("for") == "due" and isinstance(waiting.get("until"), int | float):
            self.clock.advance_to(float(waiting["until"]))  # a delayed start
            return
        if status == "suspended" and isinstance(suspension.get("deadline"), int | float):
            due_s = float(suspension["deadline"])
            if isinstance(doc.get("deadline_at"), int | float):
                due_s = min(due_s, float(doc["deadline_at"]))
            self.clock.advance_to(due_s)
            return
        history = doc.get("history") or []
        last = history[-1] if history else None
        mark = (execution_id, len(history))
        if (
            status == "running"
            and isinstance(last, dict)
            and last.get("outcome") == "failed"
            and mark not in self._skipped
        ):
            self._skipped.add(mark)
            self.clock.advance(self._backoff_s(doc, last))

    def _backoff_s(self, doc: dict[str, Any], failed: dict[str, Any]) -> float:
        """The longest the runner waits after that failed attempt: its retry policy's delay
        without jitter (jitter only shortens it)."""
        flow = self._flows.get(str(doc.get("flow_id")))
        step = next((s for s in flow.steps if s.name == failed.get("step")), None) if flow else None
        if step is None:
            return 0.0
        return step.retry.delay_s(int(failed.get("attempt") or 1), _NO_JITTER) + 0.001


class _NoJitter(random.Random):
    """A ``random()`` of 0: a retry policy's delay without its jitter."""

    def random(self) -> float:
        return 0.0


_NO_JITTER = _NoJitter()


def describe_wait(doc: dict[str, Any] | None) -> str:
    """Where an execution stands, for a timeout's message."""
    if doc is None:
        return "does not exist"
    status, suspension = doc.get("status"), doc.get("suspension") or {}
    if status != "suspended":
        return f"still {status} (step {doc.get('step')!r})"
    if suspension.get("kind") == "sleep":
        return f"still sleeping after step {suspension.get('step')!r}"
    what = f"for {suspension['wait_for']!r}" if suspension.get("wait_for") else "for a resume or its children"
    return f"still waiting in step {suspension.get('step')!r} {what} (resume it, or advance the clock)"


def _flows_of(sources: Iterable[FlowSource]) -> list[Flow]:
    flows: list[Flow] = []
    for source in sources:
        if isinstance(source, Flow):
            flows.append(source)
        elif isinstance(source, ModuleType | str):
            name = source.__name__ if isinstance(source, ModuleType) else source
            importlib.import_module(name)  # an ImportError names the module, not load_flows
            flows.extend(load_flows([name]))
        else:
            raise TypeError(f"a flow source is a Flow, a module or a module name, not {type(source).__name__}")
    return flows


def _stop(service: WorkerService | None) -> None:
    """Stop ``service`` gracefully, at once past ``STOP_TIMEOUT_S``."""
    if service is not None and not service.stop(STOP_TIMEOUT_S):
        service.stop(STOP_TIMEOUT_S, now=True)
