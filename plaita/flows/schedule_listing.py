"""What ``plaita schedules list`` and the dashboard show of every schedule (``schedule_rows``),
and which definition a schedule has when no keeper runs it here (``schedule_definition``: also
``plaita.flows.schedule_control``'s). Reads only; the keeper's pass that starts the ticks is
``plaita.flows.keeper.scheduler``."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from typing import Any

from plaita.flows.keeper.schedule_records import Recorded, read_record, scheduled_flows
from plaita.flows.model.definition import Flow
from plaita.flows.model.schedules import Schedule
from plaita.store.errors import is_redis_failure
from plaita.store.executions.keeper_store import UnreadableIndex
from plaita.store.executions.schedule_store import UnreadableSchedule
from plaita.store.executions.store import ExecutionStore, UnreadableExecution
from plaita.store.schedule_control import PAUSED_FIELD, ScheduleAccess


def schedule_rows(flows: Iterable[Flow], executions: ExecutionStore, now_s: float) -> list[dict[str, Any]]:
    """One row per schedule (``plaita schedules list``, the dashboard): the given flows', every
    one recorded for the queue and every one a keeper ran (``plaita:schedules``), with its next
    tick and its newest execution. Reads only. A schedule that cannot be shown is a row with an
    ``error``; only a Redis failure raises."""
    access = ScheduleAccess(executions, executions.ks.queue)
    store = access.schedules
    defined = dict(scheduled_flows(flows))
    rows: list[dict[str, Any]] = []
    recorded = _read_or_row(access.records.read, {}, rows)
    known = _read_or_row(store.known, [], rows)
    names = sorted({*defined, *recorded, *known})
    for flow_id, record in zip(names, store.read_many(names), strict=True):
        if isinstance(record, UnreadableSchedule):
            rows.append({"flow": flow_id, "error": str(record)})
            continue
        try:
            definition = schedule_definition(defined, recorded, flow_id, record)
            rows.append(_row(flow_id, definition, record, executions, now_s))
        except Exception as exc:
            if is_redis_failure(exc):
                raise
            rows.append({"flow": flow_id, "error": f"schedule unusable: {type(exc).__name__}: {exc}"})
    return rows


def _read_or_row(read: Any, empty: Any, rows: list[dict[str, Any]]) -> Any:
    """``read()``, or ``empty`` and an error row for an index of another type."""
    try:
        return read()
    except UnreadableIndex as bad:
        rows.append({"flow": bad.key, "error": str(bad)})
        return empty


def schedule_definition(
    defined: dict[str, Schedule], recorded: dict[str, str], flow_id: str, record: dict[str, str]
) -> Recorded:
    """The schedule a row shows: the loaded flow's, else the one recorded for the queue, else the
    one a keeper last ran (its bookkeeping hash)."""
    if flow_id in defined:
        return Recorded(defined[flow_id], math.nan)
    if flow_id in recorded:
        return read_record(recorded[flow_id])
    legacy: dict[str, Any] = {k: record[k] for k in ("cron", "tz", "missed") if k in record}
    if record.get("max_catchup", "").isdigit():
        legacy["max_catchup"] = int(record["max_catchup"])
    found = read_record(json.dumps(legacy))
    return Recorded(found.schedule, math.nan, found.error)


def _row(
    flow_id: str, definition: Recorded, record: dict[str, str], executions: ExecutionStore, now_s: float
) -> dict[str, Any]:
    schedule = definition.schedule
    if schedule is None:
        return {"flow": flow_id, "error": definition.error or "recorded schedule unusable"}
    last_id = record.get("last_execution_id") or None
    try:
        doc = executions.get(last_id) if last_id else None
    except UnreadableExecution:
        doc = {"status": "unreadable"}
    return {
        "flow": flow_id,
        **schedule.describe(),
        "next_tick_s": schedule.next_tick_s(now_s),
        "last_tick_s": int(record["last_tick_s"]) if record.get("last_tick_s", "").isdigit() else None,
        "last_execution_id": last_id,
        "last_status": doc.get("status") if doc else ("expired" if last_id else None),
        "pending": bool(record.get("pending")),
        "paused": bool(record.get(PAUSED_FIELD)),
        "recorded": bool(set(record) - {PAUSED_FIELD}),
        "recorded_at_s": None if math.isnan(definition.recorded_at_s) else definition.recorded_at_s,
    }
