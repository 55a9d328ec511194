"""Run a worker from Python: the one wiring of handler or flows, operations and signals that
``plaita worker`` uses too (the command only turns its flags into ``Settings``).

``run_worker(settings, handler=...)`` or ``run_worker(settings, flows=[...])`` runs until
SIGTERM/SIGINT (a second signal stops at once, skipping the drain) and returns 0, as the
command does. ``start_worker(...)`` runs the same worker on threads of its own and returns
its ``WorkerService``: stop it with ``request_stop()`` or ``stop()``, or use it as a context
manager. A bad configuration raises ``ConfigError`` before anything runs; a Redis failure
never ends the worker.
"""

from __future__ import annotations

import logging
import pickle
import signal
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any

from plaita.config import Settings
from plaita.errors import ConfigError
from plaita.flows import Flow, FlowRegistry, FlowRunner, load_flows
from plaita.flows.keeper.keeper import Keeper, KeeperSettings
from plaita.flows.keeper.schedule_records import ScheduleRecorder
from plaita.flows.runner.stepcall import StepCaller
from plaita.ops.alert_events import orphan_alert
from plaita.ops.keeper_build import build_keeper
from plaita.ops.keeper_metrics import KeeperMetrics
from plaita.ops.operations import Operations, attach_operations
from plaita.runtime.handlers import load_handler
from plaita.runtime.prochandler import ProcessHandler
from plaita.runtime.procpool import ProcessPool
from plaita.runtime.worker import Worker
from plaita.store.client import Client, make_client
from plaita.store.executions.schedule_records import ScheduleRecords
from plaita.store.executions.store import ExecutionStore
from plaita.store.streams.partitioned import keyspace_of, open_queue
from plaita.store.task_store import TaskStore
from plaita.tasking import TaskRegistry, load_task_registry
from plaita.tasking.runner import TaskRunner

if TYPE_CHECKING:
    from plaita.runtime.pool import Handler

logger = logging.getLogger(__name__)

#: Socket timeout of a keeper's client: short, so a frozen server costs a pass, not a minute.
KEEPER_SOCKET_TIMEOUT_S = 2.0
#: How long stopping waits for an embedded keeper's thread (its pass ends within about a second).
KEEPER_JOIN_S = 1.5
#: The caller's thread wakes this often while the worker runs, so it can run signal handlers.
JOIN_TICK_S = 0.5

#: A default handler would silently consume (and ack) whatever the queue carries.
NO_HANDLER = (
    "plaita worker needs --handler MODULE:CALLABLE, --flows MODULE or --tasks MODULE (e.g. --handler "
    "plaita.runtime.handlers:echo to log and ack every task)"
)

#: A named-task worker routes every body by its task name: a handler or flows beside it would never run.
TASKS_ALONE = (
    "--tasks cannot be combined with --handler, --flows or --keeper: a named-task worker runs every task of its "
    "queue by name; run the others in a worker of their own queue"
)

#: A flow worker runs every task as a flow task: a handler beside it would never be called.
HANDLER_AND_FLOWS = (
    "--handler cannot be combined with --flows or --keeper: a flow worker runs every task of its queue "
    "as a flow task (its plain tasks would go to the DLQ); run the handler in a worker of its own queue"
)


class WorkerService:
    """One wired worker: its handler or flow runner, its operations (registry, control,
    metrics, status file) and an optional embedded keeper. Build it with ``build_worker``."""

    def __init__(
        self,
        worker: Worker,
        ops: Operations,
        *,
        keeper: Keeper | None = None,
        runner: FlowRunner | None = None,
        runner_redis: Client | None = None,
        pool: ProcessPool | None = None,
    ) -> None:
        self.worker = worker
        self.ops = ops
        self.keeper = keeper
        self.runner = runner
        #: The client this service opened for the runner's store: closed after the runner, here,
        #: where it was made (nobody reaches into the runner for it).
        self._runner_redis = runner_redis
        #: ``--pool process``: the children steps or handlers run in (started with the worker).
        self.pool = pool
        if pool is not None:
            ops.metrics.track_pool(pool.replacements)
        self._owner = threading.Thread(target=self._serve, name="plaita-owner")
        #: Set once the worker has stopped and its keeper and clients are released. An Event, not
        #: the thread's own state: a KeyboardInterrupt inside Thread.join can leave is_alive() wrong.
        self._done = threading.Event()

    # -- running ------------------------------------------------------------------------
    def run(self, *, signals: bool = True) -> int:
        """Run until stopped; returns 0 (Redis never ends a worker). With ``signals`` (the main
        thread only) SIGTERM/SIGINT drain and stop, a second one stops at once; the previous
        handlers are back when this returns."""
        previous = self._install_signals() if signals else {}
        try:
            self.start()
            while not self._done.wait(JOIN_TICK_S):
                pass  # the calling thread wakes up to run signal handlers
        except BaseException:  # KeyboardInterrupt (signals=False): the worker must not outlive the caller
            self.request_stop()
            raise
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        return 0

    def start(self) -> WorkerService:
        """Run the worker on a thread of its own (no signal handlers); returns self."""
        self._owner.start()
        return self

    def request_stop(self, *, now: bool = False) -> None:
        """Ask for a graceful stop (``now`` skips the drain). Safe from any thread."""
        self.worker.request_stop(now=now)

    def join(self, timeout_s: float | None = None) -> bool:
        """Wait for the worker to stop; True once it has (False: ``timeout_s`` passed first)."""
        return self._owner.ident is None or self._done.wait(timeout_s)

    def stop(self, timeout_s: float | None = None, *, now: bool = False) -> bool:
        """``request_stop`` then ``join``: the stop is bounded by the drain (``drain_timeout_s``)."""
        self.request_stop(now=now)
        return self.join(timeout_s)

    def __enter__(self) -> WorkerService:
        return self if self._owner.ident is not None else self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- inside ---------------------------------------------------------------------------
    def _install_signals(self) -> dict[int, Any]:
        _require_main_thread()
        signals_seen = 0

        def on_signal(_signum: int, _frame: FrameType | None) -> None:
            nonlocal signals_seen
            signals_seen += 1
            # Only post a request: the owner thread turns it into stop_requested.
            self.worker.request_stop(now=signals_seen > 1)

        return {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}

    def _serve(self) -> None:
        keeper_thread = None
        if self.keeper is not None:
            keeper_thread = threading.Thread(target=self.keeper.run, name="plaita-keeper", daemon=True)
            keeper_thread.start()
            logger.info("keeper running in this worker (%s)", self.keeper.holder)
        try:
            if self.pool is not None:
                self.pool.start()
                logger.info("step pool: %d child processes (%s)", self.pool.size, self.pool.method)
            self.worker.run()
        except Exception:  # a bug, not a Redis failure: say so loudly, still exit cleanly
            logger.critical("worker loop crashed (a plaita bug; please report it)", exc_info=True)
        finally:
            self._stop_keeper(keeper_thread)
            if self.pool is not None:
                self.pool.close()  # after the drain: no step of this worker runs any more
            if self.runner is not None:
                _close_quietly(self.runner)  # its loop connection and cancel watcher: no task runs now
            if self._runner_redis is not None:
                _close_quietly(self._runner_redis)
            self._done.set()

    def _stop_keeper(self, thread: threading.Thread | None) -> None:
        """Stop the keeper, its keeper lease handed over; its client is closed only once its
        thread has ended (closing it under a pass would log a Redis failure for nothing)."""
        if self.keeper is None or thread is None:
            return
        self.keeper.request_stop()
        thread.join(KEEPER_JOIN_S)
        if not thread.is_alive():
            self.keeper.io.close()


def build_worker(
    settings: Settings | None = None,
    *,
    handler: Handler | str | None = None,
    flows: Sequence[str | Flow] = (),
    keeper: bool = False,
    tasks: str | TaskRegistry | None = None,
) -> WorkerService:
    """A worker wired and ready to run, not yet running. ``handler``: a callable taking a
    ``Task`` (sync or ``async def``) or ``"MODULE:CALLABLE"``; ``flows``: module names and/or
    ``Flow`` objects (then the handler is a ``FlowRunner``); ``keeper``: also run a keeper in
    this worker (needs ``flows``); ``tasks``: a ``TaskRegistry`` or the module holding one (named
    tasks, alone). ConfigError for anything wrong (nothing is left running)."""
    settings = settings if settings is not None else Settings()
    flows = [flows] if isinstance(flows, str) else flows  # one module name, not its letters
    check_status_file(settings.status_file)
    if tasks is not None and (handler is not None or flows or keeper):
        raise ConfigError(TASKS_ALONE)
    if tasks is not None:
        return _tasks_service(settings, tasks)
    if handler is not None and (flows or keeper):
        raise ConfigError(HANDLER_AND_FLOWS)
    if flows or keeper:
        return _flow_service(settings, flows, keeper=keeper)
    if handler is None:
        raise ConfigError(NO_HANDLER)
    callable_handler: Any = load_handler(handler) if isinstance(handler, str) else handler
    pool = None
    if settings.pool == "process":
        _check_importable({"--handler": callable_handler})
        pool = process_pool(settings, [getattr(callable_handler, "__module__", None) or ""])
        callable_handler = ProcessHandler(callable_handler, pool, time_limit_s=settings.step_time_limit_s)
    worker = Worker(settings, callable_handler)
    return WorkerService(worker, _attach(worker), pool=pool)


def run_worker(
    settings: Settings | None = None,
    *,
    handler: Handler | str | None = None,
    flows: Sequence[str | Flow] = (),
    keeper: bool = False,
    signals: bool = True,
    tasks: str | TaskRegistry | None = None,
) -> int:
    """Build the worker (see ``build_worker``) and run it until stopped; returns 0."""
    if signals:
        _require_main_thread()  # before building: a refused run leaves nothing behind
    return build_worker(settings, handler=handler, flows=flows, keeper=keeper, tasks=tasks).run(signals=signals)


def start_worker(
    settings: Settings | None = None,
    *,
    handler: Handler | str | None = None,
    flows: Sequence[str | Flow] = (),
    keeper: bool = False,
    tasks: str | TaskRegistry | None = None,
) -> WorkerService:
    """Build the worker and run it on threads of its own; returns its running ``WorkerService``."""
    return build_worker(settings, handler=handler, flows=flows, keeper=keeper, tasks=tasks).start()


def check_status_file(path: str | None) -> None:
    """ConfigError unless the status file can be written (its directory exists and is writable)."""
    if not path:
        return
    probe = Path(path).with_name(f".{Path(path).name}.plaita-probe")
    try:
        probe.write_text("", encoding="utf-8")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(f"--status-file {path}: cannot write there ({exc.strerror or exc})") from None


def _flow_service(settings: Settings, flows: Sequence[str | Flow], *, keeper: bool) -> WorkerService:
    """A FlowRunner over the flows, with every task leased before it starts (checkpoints are
    fenced from the first step); with ``keeper`` also a keeper, run on a thread of its own."""
    if not flows:
        raise ConfigError("--keeper runs inside a flow worker: give --flows MODULE too")
    registry = _registry(flows)
    pool = _step_pool(settings, registry)  # before any connection: a refusal leaves nothing open
    settings = settings.with_(eager_leases=True)
    name = f"plaita:{settings.consumer_name}:flows".replace(" ", "_")
    client = make_client(
        settings.redis_url, socket_timeout_s=settings.socket_timeout_s, client_name=name, tls=settings.tls
    )
    steps = StepCaller(pool, time_limit_s=settings.step_time_limit_s)
    # Flow slots (max_concurrent) outlive a dead worker exactly as long as its leases do.
    runner = FlowRunner(
        registry,
        ExecutionStore(client, keyspace_of(settings)),
        slot_ttl_s=settings.lease_ttl_s,
        version_wait_s=settings.version_wait_s,
        steps=steps,
    )
    runner.handover.group = settings.consumer_group  # hand over only to workers of our group
    try:
        # Steps run as coroutines on the async pool's loop; sync steps move to threads there.
        worker = Worker(settings, runner.run_async)
        ops = _attach(worker)
    except BaseException:
        _close_quietly(client)
        raise
    runner.add_observer(worker.observers)  # execution metrics and the in-flight count
    ops.track_executions()
    # Its schedules recorded for the queue (and again every minute): the queue's acting keeper runs them.
    ops.periodic.append(ScheduleRecorder(registry, ScheduleRecords(client, keyspace_of(settings).queue)).refresh)
    keeper_ = _keeper(settings, registry, ops) if keeper else None
    return WorkerService(worker, ops, keeper=keeper_, runner=runner, runner_redis=client, pool=pool)


def _tasks_service(settings: Settings, tasks: str | TaskRegistry) -> WorkerService:
    """A TaskRunner over the registry's named tasks, on a client of its own (its results and
    retries, which wait in the delayed set every worker's reclaim pass moves)."""
    registry = load_task_registry(tasks) if isinstance(tasks, str) else tasks
    if not isinstance(registry, TaskRegistry) or not len(registry):
        raise ConfigError("tasks: give a module name or a TaskRegistry with at least one task")
    pool = None
    if settings.pool == "process":
        functions = {f"task {d.name}": d.fn for d in registry}
        _check_importable(functions)
        pool = process_pool(settings, [getattr(fn, "__module__", None) or "" for fn in functions.values()])
    name = f"plaita:{settings.consumer_name}:tasks".replace(" ", "_")
    client = make_client(
        settings.redis_url, socket_timeout_s=settings.socket_timeout_s, client_name=name, tls=settings.tls
    )
    runner = TaskRunner(
        registry, TaskStore(open_queue(settings, client=client)), pool=pool, time_limit_s=settings.step_time_limit_s
    )
    try:
        worker = Worker(settings, runner)
        ops = _attach(worker)
    except BaseException:
        _close_quietly(client)
        raise
    return WorkerService(worker, ops, runner_redis=client, pool=pool)


def process_pool(settings: Settings, modules: Sequence[str]) -> ProcessPool:
    """The ``--pool process`` children (not started): ``--concurrency`` of them, the fork server
    preloading ``modules`` (the steps' or the handler's), so a replacement starts in milliseconds."""
    return ProcessPool(
        settings.concurrency,
        max_tasks_per_child=settings.max_tasks_per_child,
        max_memory_per_child_mb=settings.max_memory_per_child_mb,
        preload=sorted({m for m in modules if m and m != "__main__"}),
    )


def _step_pool(settings: Settings, registry: FlowRegistry) -> ProcessPool | None:
    if settings.pool != "process":
        return None
    steps = {f"step {f.flow_id}.{s.name}": s.fn for f in registry for s in f.steps}
    _check_importable(steps)
    return process_pool(settings, [getattr(fn, "__module__", None) or "" for fn in steps.values()])


def _check_importable(functions: dict[str, Any]) -> None:
    """ConfigError unless each function can be sent to a child by its module path (a module-level
    function or class: not a lambda, a closure or a function defined in ``__main__``)."""
    for what, fn in functions.items():
        try:
            pickle.dumps(fn)
        except Exception as exc:
            raise ConfigError(
                f"--pool process: {what} cannot be sent to a child process by its module path ({exc}); "
                "define it at module level of an importable module"
            ) from None
        if getattr(fn, "__module__", None) == "__main__":
            raise ConfigError(f"--pool process: {what} is defined in __main__; move it to an importable module")


def _registry(flows: Sequence[str | Flow]) -> FlowRegistry:
    """Flows by id from module names (``load_flows``) and ``Flow`` objects, in the order given."""
    for f in flows:
        if not isinstance(f, str | Flow):
            raise ConfigError(f"flows: {f!r} is neither a module name nor a Flow")
    registry = load_flows([f for f in flows if isinstance(f, str)])
    for f in flows:
        if isinstance(f, Flow):
            registry.add(f)
    return registry


def _attach(worker: Worker) -> Operations:
    """The operator side of ``worker``; binding ``metrics_port`` may fail (ConfigError): the
    worker's connections are released then, since it will never run."""
    try:
        return attach_operations(worker)
    except BaseException:
        worker.queue.close()
        raise


def _keeper(settings: Settings, flows: FlowRegistry, ops: Operations) -> Keeper:
    """A keeper (``embedded_keeper_settings``) on its own short-timeout client; it starts the ticks of
    the scheduled ``flows`` and sends its orphans to the worker's alert webhook, if any."""
    client = make_client(
        settings.redis_url, socket_timeout_s=KEEPER_SOCKET_TIMEOUT_S, client_name="plaita:keeper", tls=settings.tls
    )
    queue = open_queue(settings, client=client)
    store = ExecutionStore(client, queue.keyspace)
    on_orphaned = orphan_alert(ops.alerts.sender) if ops.alerts is not None else None
    keeper = build_keeper(store, queue, embedded_keeper_settings(settings), flows=flows, on_orphaned=on_orphaned)
    # Its passes on the worker's /metrics (plaita_keeper_*); readiness stays the worker's own.
    metrics = KeeperMetrics(registry=ops.metrics.registry)
    keeper.on_pass, keeper.on_failure = metrics.on_pass, metrics.on_failure
    return keeper


def embedded_keeper_settings(settings: Settings) -> KeeperSettings:
    """The keeper defaults, with the worker's ``--keeper-lease-ttl-s``; its passes (which renew the
    lease too) at most half a lease apart, so a lease this short is never lost between two."""
    ttl_s = settings.keeper_lease_ttl_s
    return KeeperSettings(lease_ttl_s=ttl_s, interval_s=min(KeeperSettings.interval_s, ttl_s / 2))


def _require_main_thread() -> None:
    """Python runs signal handlers on the main thread only: anywhere else, stop with ``request_stop``."""
    if threading.current_thread() is not threading.main_thread():
        raise ConfigError("signals=True needs the main thread; pass signals=False and call request_stop()")


def _close_quietly(client: Any) -> None:
    try:
        client.close()
    except Exception:  # closing is best effort during shutdown
        logger.debug("closing a redis client failed", exc_info=True)
