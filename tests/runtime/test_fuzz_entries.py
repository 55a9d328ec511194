"""Issue 10: fuzz the worker with hostile stream entries on a real private Redis.

Hypothesis generates a stream: valid tasks interleaved with hostile entries (arbitrary bytes in
field names and values, deep and wide JSON, lone surrogates, huge and empty values, missing
and duplicated fields), and sometimes wrong-typed lease keys for some executions or a
wrong-typed DLQ key. An in-process worker consumes it. Invariant:

* every valid task whose keys are sound completes (runs and is acked);
* every hostile entry ends in the DLQ, or stays pending only when the key it needs (its lease,
  the DLQ) holds the wrong type;
* the worker never stops consuming: a sentinel task added last completes too.

Which entries are valid is decided by the pure parser (``decode_fields`` + ``parse_entry``),
the same rule the worker must apply. Bounded for CI: ``max_examples`` examples, no shrinking
(each example runs a worker; a shrink would take minutes), no example database in the repo.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from plaita.errors import BadTaskError
from plaita.tasks import decode_fields, parse_entry
from tests.support.workers import running_worker, wait_for

pytestmark = pytest.mark.redis

STREAM = "plaita:test:queue"
GROUP = "plaita-workers"
DLQ = f"{STREAM}:dlq"
LEASE = "plaita:execution:lease:"
MAX_PAYLOAD_BYTES = 64 * 1024
#: Per-example bound for the whole stream to be consumed (an idle worker takes milliseconds).
SETTLE_S = 8.0

Flat = list[bytes]


def _good_body(n: int, execution_id: str, kind: str, blob: str, wide: int) -> dict[str, Any]:
    params: dict[str, Any] = {"n": n, "blob": blob}
    if wide:
        params["wide"] = {f"k{i}": i for i in range(wide)}
    return {"type": kind, "execution_id": execution_id, "flow_id": "f", "params": params}


@st.composite
def good_entry(draw: st.DrawFn, n: int) -> tuple[Flat, str]:
    """A valid task: (flat fields, its execution id)."""
    execution_id = f"fx-{n}-{draw(st.integers(0, 10**6))}"
    body = _good_body(
        n,
        execution_id,
        draw(st.sampled_from(["start", "resume"])),
        draw(st.text(max_size=40)),
        draw(st.sampled_from([0, 0, 0, 2000])),
    )
    flat = [b"payload", json.dumps(body, ensure_ascii=draw(st.booleans())).encode(), b"schema_version", b"1"]
    if draw(st.booleans()):
        flat += [b"origin", draw(st.text(max_size=10)).encode()]
    return flat, execution_id


def _payload(text: str | bytes) -> Flat:
    return [b"payload", text if isinstance(text, bytes) else text.encode()]


HOSTILE: st.SearchStrategy[Flat] = st.one_of(
    # arbitrary bytes in names and values (at least one pair: XADD needs a field)
    st.lists(st.tuples(st.binary(max_size=8), st.binary(max_size=40)), min_size=1, max_size=4).map(
        lambda pairs: [b for pair in pairs for b in pair]
    ),
    # a non-UTF-8 name next to a valid payload
    st.binary(min_size=1, max_size=4)
    .filter(lambda b: not _is_utf8(b))
    .map(lambda name: [name, b"x", b"payload", b'{"type":"start"}']),
    # deep JSON, under the size limit
    st.integers(2_000, 30_000).map(lambda k: _payload('{"type":"start","x":' + "[" * k + "]" * k + "}")),
    # wide JSON of the wrong shape
    st.integers(1_000, 5_000).map(lambda k: _payload(json.dumps({"type": "bogus", "x": list(range(k))}))),
    # lone surrogates (escaped in JSON text: the raw bytes are valid UTF-8)
    st.sampled_from(["execution_id", "flow_id"]).map(lambda key: _payload('{"type":"start","' + key + '":"\\ud800"}')),
    # huge and empty values, no payload, duplicated payload
    st.integers(MAX_PAYLOAD_BYTES + 1, MAX_PAYLOAD_BYTES * 4).map(lambda size: _payload(b"x" * size)),
    st.just(_payload(b"")),
    st.just([b"body", b'{"type":"start"}']),
    st.just([b"payload", b'{"type":"start"}', b"payload", b'{"type":"resume"}']),
    # valid JSON, not a task
    st.sampled_from([b"[]", b"null", b'{"type":[]}', b'{"type":"start","execution_id":7}']).map(_payload),
)


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def is_valid(flat: Flat) -> bool:
    """The worker's own rule: does this entry parse as a task?"""
    fields, problems = decode_fields(flat)
    try:
        parse_entry("0-1", fields, 1, max_payload_bytes=MAX_PAYLOAD_BYTES, problems=problems)
    except BadTaskError:
        return False
    return True


class Scenario:
    """One generated stream; a plain class so that a failing example prints its short repr."""

    def __init__(self, entries: list[tuple[Flat, str | None]], wrong_leases: set[str], wrong_dlq: bool) -> None:
        self.entries = entries  # (flat fields, execution id of a valid task)
        self.wrong_leases = wrong_leases
        self.wrong_dlq = wrong_dlq

    def __repr__(self) -> str:
        """Short: a failing example is printed, and its entries may be megabytes."""
        shown = [(b" ".join(x[:40] for x in flat)[:120], sum(map(len, flat)), e) for flat, e in self.entries]
        return f"Scenario(entries={shown!r}, wrong_leases={self.wrong_leases!r}, wrong_dlq={self.wrong_dlq})"


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    entries: list[tuple[Flat, str | None]] = []
    for n in range(draw(st.integers(1, 8))):
        if draw(st.booleans()):
            entries.append(draw(good_entry(n)))
        else:
            entries.append((draw(HOSTILE), None))
    ids = [e for _flat, e in entries if e is not None]
    wrong = set(draw(st.lists(st.sampled_from(ids), max_size=2))) if ids and draw(st.booleans()) else set()
    return Scenario(entries, wrong, wrong_dlq=draw(st.integers(0, 4)) == 0)


def _dlq_sources(rclient: redis.Redis) -> set[str]:
    if rclient.type(DLQ) != "stream":
        return set()
    return {json.loads(f["payload"])["source_id"] for _id, f in rclient.xrange(DLQ)}


def _pending(rclient: redis.Redis) -> set[str]:
    try:
        rows = rclient.xpending_range(STREAM, GROUP, min="-", max="+", count=1000)
    except redis.ResponseError:
        return set()
    return {str(r["message_id"]) for r in rows}


@settings(
    max_examples=25,
    deadline=None,
    database=None,
    phases=(Phase.explicit, Phase.generate),
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(scenario=scenarios())
def test_hostile_stream_never_stops_consumption(scenario: Scenario, redis_url: str, rclient: redis.Redis) -> None:
    rclient.flushall()
    for execution_id in scenario.wrong_leases:
        rclient.hset(f"{LEASE}{execution_id}", "a", "b")
    if scenario.wrong_dlq:
        rclient.set(DLQ, "not a stream")
    raw = redis.Redis.from_url(redis_url, socket_timeout=10)
    try:
        with running_worker(redis_url, concurrency=2, max_payload_bytes=MAX_PAYLOAD_BYTES) as rw:
            added = [
                (raw.execute_command("XADD", STREAM, "*", *flat).decode(), flat, e) for flat, e in scenario.entries
            ]
            must_run = {mid for mid, flat, e in added if is_valid(flat) and e not in scenario.wrong_leases}
            hostile = {mid for mid, flat, _e in added if not is_valid(flat)}
            may_stay = {mid for mid, _flat, e in added if e in scenario.wrong_leases}
            if scenario.wrong_dlq:
                may_stay |= hostile

            def settled() -> bool:
                pending, dead = _pending(rclient), _dlq_sources(rclient)
                ran = set(rw.recorder.ids())
                return (
                    must_run <= ran
                    and not (must_run & pending)
                    and all(mid in dead or mid in may_stay for mid in hostile)
                    and not (pending - may_stay)
                )

            wait_for(settled, SETTLE_S, f"the stream to settle: {scenario}")
            sentinel = raw.execute_command(
                "XADD", STREAM, "*", "payload", json.dumps({"type": "start", "params": {"n": "sentinel"}})
            ).decode()
            wait_for(lambda: sentinel in rw.recorder.ids(), SETTLE_S, "the sentinel task: the worker still consumes")
            assert rw.alive
    finally:
        raw.close()
