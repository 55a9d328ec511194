"""The pure side of named tasks: what a body asks for, whatever it holds, and the backoff."""

from __future__ import annotations

import json
from typing import Any

import hypothesis.strategies as st
from hypothesis import HealthCheck, given, settings

from plaita.errors import BadTaskError
from plaita.tasking.registry import ENVELOPE_FIELDS, TaskCall, TaskDef, parse_call
from plaita.tasks import parse_entry

JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)
BODIES = st.fixed_dictionaries(
    {"type": st.sampled_from(["task", "send_email", "start", ""]) | JSONISH},
    optional={
        "task": JSONISH | st.sampled_from(["add"]),
        "args": JSONISH,
        "kwargs": JSONISH,
        "attempt": JSONISH,
        "task_id": JSONISH,
        "execution_id": JSONISH,
        "to": JSONISH,
    },
)


@settings(max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(BODIES)
def test_a_named_body_is_a_call_or_a_bad_task_nothing_else(body: dict[str, Any]) -> None:
    fields = {"payload": json.dumps(body).encode(), "schema_version": b"1"}
    try:
        task = parse_entry("1-0", fields, 1, max_payload_bytes=1 << 20, named=True)
        call = parse_call(task.body, task.message_id)
    except BadTaskError as exc:
        assert exc.reason
        return
    assert isinstance(call, TaskCall) and isinstance(call.name, str) and call.name
    assert isinstance(call.args, list) and isinstance(call.kwargs, dict) and call.attempt >= 1
    assert call.task_id == (body["task_id"] if isinstance(body.get("task_id"), str) and body["task_id"] else "1-0")
    if body["type"] != "task":
        assert call.name == body["type"] and not set(call.kwargs) & ENVELOPE_FIELDS


def test_a_type_routed_body_passes_its_other_fields_as_kwargs() -> None:
    body = {"type": "send_email", "to": "a", "subject": "s", "task_id": "t", "attempt": 2, "tenant_id": "x"}
    assert parse_call(body, "9-0") == TaskCall("send_email", [], {"to": "a", "subject": "s"}, "t", 2)


def test_the_backoff_doubles_from_backoff_s_up_to_its_cap_with_bounded_jitter() -> None:
    definition = TaskDef("t", print, retries=10, backoff_s=0.5, backoff_max_s=3.0)
    for attempt, base in [(1, 0.5), (2, 1.0), (3, 2.0), (4, 3.0), (9, 3.0)]:
        delays = [definition.retry_delay_s(attempt) for _ in range(50)]
        assert all(base <= d <= base * 1.25 for d in delays), (attempt, delays)
