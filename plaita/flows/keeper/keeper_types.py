"""What a keeper is told (``KeeperSettings``), what one of its passes did (``KeeperPass``,
logged by ``log_pass``) and the task a due suspension gets (``due_body``); the keeper itself,
which decides when, is ``plaita.flows.keeper.keeper``."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from plaita.errors import ConfigError
from plaita.flows.model import bodies as model
from plaita.flows.model.validate import epoch_or_none

if TYPE_CHECKING:
    from plaita.flows.keeper_io import KeeperTenantIO, UnreadableExecution, UnreadableIndex

logger = logging.getLogger("plaita.flows.keeper.keeper")  # the keeper's own log, as before the split

#: Unreadable keys remembered (each is logged once); past this the memory starts over.
MAX_REMEMBERED_BAD = 10_000
#: What a pass skips for a tenant whose index is of another type, by the part that met it.
SKIPPED_PARTS = {"_timeouts": "timeouts and wakes", "_orphans": "recovery retries and orphans"}


@dataclass(frozen=True)
class KeeperSettings:
    interval_s: float = 5.0
    #: Running and unleased this long without an update = orphaned for good (2 h: far longer than
    #: any step should run, so only a lost execution waits that long).
    zombie_after_s: float = 7200.0
    #: At most one recovery retry per execution per cooldown (15 min: a retry needs time to be
    #: read and run before the next one is worth sending).
    retry_cooldown_s: float = 900.0
    #: A timeout task not acted on is sent again after this.
    timeout_cooldown_s: float = 60.0
    #: Running executions updated more recently than this are left alone (a worker between
    #: reading a task and taking its lease, or between a step and its checkpoint).
    orphan_grace_s: float = 10.0
    lease_ttl_s: float = 30.0
    batch: int = 100
    #: The orphan pass reads the whole stream to know which executions have a task; a longer
    #: stream skips that pass (retrying then could duplicate work already queued).
    max_stream_scan: int = 100_000
    #: Running executions examined per pass at most (in pages of ``batch``).
    max_candidates: int = 10_000
    retention_s: int = model.DEFAULT_RETENTION_S
    dry_run: bool = False
    backoff_base_s: float = 0.1
    backoff_cap_s: float = 1.0
    persistent_backoff_s: float = 5.0

    def __post_init__(self) -> None:
        if self.interval_s <= 0 or self.zombie_after_s <= 0 or self.retry_cooldown_s < 1 or self.batch < 1:
            raise ConfigError("keeper needs interval, zombie-after > 0, a cooldown >= 1 s and a batch >= 1")
        if self.lease_ttl_s <= self.interval_s:
            raise ConfigError("--keeper-lease-ttl-s must be longer than --interval-s")


@dataclass
class KeeperPass:
    """What one pass did (or, in dry-run mode, would have done)."""

    acting: bool = True
    timeouts: list[str] = field(default_factory=list)
    retries: list[str] = field(default_factory=list)
    orphaned: list[str] = field(default_factory=list)
    #: Unreadable execution keys met in the indexes and skipped (left as they are).
    corrupt: list[str] = field(default_factory=list)
    skipped_scan: bool = False
    #: Durable sleeps past their deadline, woken (``continue``).
    wakes: list[str] = field(default_factory=list)
    #: Executions started for schedule ticks (plaita.flows.keeper.scheduler).
    scheduled: list[str] = field(default_factory=list)
    #: Suspended executions past their whole-execution deadline, cancelled.
    expired: list[str] = field(default_factory=list)
    #: A full pass (False: only the deadline part, run between full passes when one is due).
    full: bool = True
    #: How long the pass took (monotonic seconds), for the keeper's metrics.
    duration_s: float = 0.0


def log_pass(report: KeeperPass) -> None:
    if report.wakes:
        logger.info("keeper: %d sleep(s) woken %s", len(report.wakes), report.wakes[:10])
    if report.expired:
        logger.info(
            "keeper: %d execution(s) past their deadline cancelled %s", len(report.expired), report.expired[:10]
        )
    if report.corrupt:
        logger.debug("keeper: %d unreadable execution key(s) skipped %s", len(report.corrupt), report.corrupt[:10])
    if report.scheduled:
        logger.info("keeper: %d scheduled execution(s) started %s", len(report.scheduled), report.scheduled[:10])
    if report.timeouts or report.retries or report.orphaned:
        logger.info(
            "keeper: %d timeout(s) %s, %d recovery retr%s %s, %d orphaned %s",
            len(report.timeouts),
            report.timeouts[:10],
            len(report.retries),
            "y" if len(report.retries) == 1 else "ies",
            report.retries[:10],
            len(report.orphaned),
            report.orphaned[:10],
        )


def due_body(
    store: KeeperTenantIO,
    eid: str,
    doc: dict[str, Any],
    suspension: dict[str, Any],
    now_s: float,
    report: KeeperPass,
) -> dict[str, Any]:
    """What a due suspension gets: ``cancel`` past the execution's deadline, ``continue``
    for a durable sleep (its deadline is its wake), else ``timeout``."""
    seq, flow_id, tenant = suspension.get("seq"), doc.get("flow_id"), store.tenant
    deadline_at = epoch_or_none(doc.get("deadline_at"))
    if deadline_at is not None and deadline_at <= now_s:
        report.expired.append(label(store, eid))
        return model.resume_body(eid, "cancel", flow_id=flow_id, resume_id=f"deadline:{seq}", tenant_id=tenant)
    wake = suspension.get("kind") == "sleep"
    (report.wakes if wake else report.timeouts).append(label(store, eid))
    kind = "wake" if wake else "timeout"
    return model.resume_body(
        eid,
        "continue" if wake else "timeout",
        flow_id=flow_id,
        suspension=seq,
        resume_id=f"{kind}:{seq}",
        tenant_id=tenant,
    )


def label(store: KeeperTenantIO, eid: str) -> str:
    """How a report names an execution: its id, ``<tenant>/<id>`` for a tenant's."""
    return f"{store.tenant}/{eid}" if store.tenant else eid


class Skips:
    """What a keeper skipped and left for an operator: one bad key must not stop a pass, and
    deleting it would destroy what an operator may still repair. Counted every time it is met,
    logged once per key and process."""

    def __init__(self) -> None:
        self.count = 0
        self._logged: set[str] = set()

    def execution(self, bad: UnreadableExecution, report: KeeperPass) -> None:
        report.corrupt.append(bad.execution_id)
        self._met(bad.key, f"{bad.key} {bad.why}; skipped")

    def index(self, bad: UnreadableIndex, store: KeeperTenantIO | None, part: str, report: KeeperPass) -> None:
        """A tenant's index of another type (``store`` None: the tenants set itself)."""
        report.corrupt.append(bad.key)
        if store is None:
            self._met(bad.key, f"{bad}; every tenant but the default one skipped")
            return
        tenant = f"tenant {store.tenant}" if store.tenant else "the default tenant"
        self._met(bad.key, f"{bad}; the {SKIPPED_PARTS.get(part, part)} of {tenant} skipped")

    def _met(self, key: str, text: str) -> None:
        self.count += 1
        if key in self._logged:
            return
        if len(self._logged) >= MAX_REMEMBERED_BAD:
            self._logged.clear()
        self._logged.add(key)
        logger.warning("keeper: %s (logged once, left for an operator)", text)
