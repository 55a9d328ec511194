"""``FlowClient.list`` and ``FlowClient.steps`` (``plaita.flows.producer.listing``): typed rows,
each filter, keyset paging that neither repeats nor skips while executions start, every
tenant, the bounded scan of a filter the index cannot serve, and the steps of a run that
retried and of one that ended in error. Real server, real runner."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest
import redis

from plaita import ExecutionPage, ExecutionRow, StepRow
from plaita.flows.producer.client import ExecutionNotFound, FlowClient
from plaita.flows.producer.listing import list_executions
from tests.flows.support import Harness, start

pytestmark = pytest.mark.redis


def ids(page: ExecutionPage) -> list[str]:
    return [r.execution_id for r in page.rows]


def everything(flows: FlowClient, **filters: object) -> list[str]:
    """Every id the filters list, page after page (at most 100 pages)."""
    found: list[str] = []
    cursor = None
    for _ in range(100):
        page = flows.list(limit=7, cursor=cursor, **filters)  # type: ignore[arg-type]
        found += ids(page)
        cursor = page.cursor
        if cursor is None:
            return found
    raise AssertionError("more than 100 pages")


def test_rows_are_typed_and_each_filter_selects(h: Harness, rclient: redis.Redis) -> None:
    flows = h.flows
    first = [flows.start("ledger3", {"i": i}) for i in range(3)]
    mid_s = time.time()
    wait_until_later(mid_s)
    v2 = flows.start("ledger3", {"i": 9}, version="v2")
    h.run(start("done-1", "ledger3"))
    h.run(start("err-1", "flaky", fail_times=5))
    link = {"id": "done-1", "step": "one", "index": 0}  # a child's link to its parent, as spawn writes it
    child = {"execution_id": "kid", "flow_id": "ledger3", "status": "completed", "step": "three", "parent": link}
    child |= {"created_at": time.time(), "results": {}}
    rclient.set("plaita:execution:kid", json.dumps(child))
    rclient.zadd("plaita:executions:status:completed", {"kid": time.time()})

    page = flows.list()
    assert page.cursor is None and not page.capped and page.unreadable == []
    assert ids(page) == ["kid", "err-1", "done-1", v2, *reversed(first)]  # newest update first
    row = page.rows[1]
    assert isinstance(row, ExecutionRow) and dataclasses.is_dataclass(row)
    assert (row.flow_id, row.status, row.step, row.tenant) == ("flaky", "error", "wobble", "")
    assert row.error is not None and row.error["type"] == "RuntimeError" and row.params is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        row.status = "x"  # type: ignore[misc]

    assert ids(flows.list(status="queued")) == [v2, *reversed(first)]
    assert ids(flows.list(status=["error", "completed"])) == ["kid", "err-1", "done-1"]
    assert ids(flows.list(flow="flaky")) == ["err-1"]
    assert ids(flows.list(version="v2")) == [v2]
    assert ids(flows.list(parent_id="done-1")) == ["kid"]
    assert set(ids(flows.list(created_before=mid_s))) == set(first)
    assert set(ids(flows.list(created_after=mid_s))) == {v2, "done-1", "err-1", "kid"}
    assert ids(flows.list(created_after=mid_s, status="queued", version="v2")) == [v2]
    kid, done = flows.list(status="completed", flow="ledger3", include_result=True).rows
    assert done.result == {"three": 3} and kid.result is None and kid.parent_id == "done-1"
    [queued] = flows.list(version="v2", include_params=True).rows
    assert queued.params == {"i": 9} and queued.version == "v2" and queued.result is None


def wait_until_later(then_s: float) -> None:
    """Until the wall clock has moved past ``then_s`` (bounded: a clock moves within ms)."""
    deadline = time.monotonic() + 5
    while time.time() <= then_s:
        assert time.monotonic() < deadline, "the wall clock did not move"


def test_paging_with_a_cursor_neither_repeats_nor_skips_while_executions_start(flows: FlowClient) -> None:
    before = [flows.start("ledger3", {"i": i}) for i in range(130)]
    seen: list[str] = []
    page = flows.list(limit=50)
    started_meanwhile: list[str] = []
    for _ in range(10):
        seen += ids(page)
        if page.cursor is None:
            break
        started_meanwhile += [flows.start("ledger3") for _ in range(7)]  # land before the cursor
        page = flows.list(limit=50, cursor=page.cursor)
    assert len(seen) == len(set(seen)) == 130
    assert seen == list(reversed(before))
    fresh = ids(flows.list(limit=50))
    assert fresh[: len(started_meanwhile)] == list(reversed(started_meanwhile))  # a new first page shows them


def test_every_tenant_and_one_tenant(flows: FlowClient) -> None:
    mine = flows.start("ledger3")
    t1 = flows.for_tenant("t1")
    theirs = [t1.start("ledger3") for _ in range(3)]
    other = flows.for_tenant("t2").start("ledger3")
    assert ids(flows.list()) == [mine]
    assert ids(t1.list()) == list(reversed(theirs)) == ids(flows.list(tenant="t1"))
    rows = flows.list(all_tenants=True).rows
    assert {(r.execution_id, r.tenant) for r in rows} == {(mine, ""), *((e, "t1") for e in theirs), (other, "t2")}
    assert everything(t1, all_tenants=True) == [r.execution_id for r in rows]  # the same from any tenant
    with pytest.raises(ValueError, match="all_tenants"):
        flows.list(all_tenants=True, tenant="t1")


def test_a_filter_the_index_cannot_serve_scans_a_bounded_number_of_entries(flows: FlowClient) -> None:
    old = flows.start("rare")
    for _ in range(30):
        flows.start("common")
    page = list_executions([flows.store], flow="rare", max_scanned=20)
    assert page.rows == [] and page.capped and page.scanned == 20 and page.cursor is not None
    rest = list_executions([flows.store], flow="rare", max_scanned=20, cursor=page.cursor)
    assert ids(rest) == [old] and not rest.capped and rest.cursor is None
    assert everything(flows, flow="rare") == [old]


def test_bad_arguments_are_value_errors(flows: FlowClient) -> None:
    bads = [{"status": "done"}, {"status": []}, {"limit": 0}, {"limit": 1001}, {"cursor": "not-one"}]
    bads += [{"created_after": float("nan")}, {"tenant": "bad:tenant"}, {"cursor": "WyJuYW4iLCAiIiwgIngiXQ"}]
    for bad in bads:
        with pytest.raises(ValueError):
            flows.list(**bad)  # type: ignore[arg-type]


def test_steps_after_retries_and_after_an_error(h: Harness) -> None:
    h.run(start("ok-after-2", "flaky", fail_times=2))
    [wobble] = h.flows.steps("ok-after-2", include_output=True)
    assert isinstance(wobble, StepRow)
    assert (wobble.name, wobble.attempts, wobble.outcome, wobble.error) == ("wobble", 3, "ok", None)
    assert wobble.output == {"attempt": 3} and wobble.started_at is not None and wobble.ended_at is not None
    assert wobble.ended_at >= wobble.started_at

    h.run(start("gave-up", "flaky", fail_times=5))
    [failed] = h.flows.steps("gave-up")
    assert (failed.attempts, failed.outcome, failed.output) == (3, "error", None)
    assert failed.error is not None and "flaky failure 3" in failed.error

    h.run(start("three-steps", "ledger3"))
    steps = h.flows.steps("three-steps")
    assert [(s.name, s.attempts, s.outcome) for s in steps] == [("one", 1, "ok"), ("two", 1, "ok"), ("three", 1, "ok")]
    assert all(s.output is None for s in steps)
    with pytest.raises(ExecutionNotFound):
        h.flows.steps("nobody")


def test_entries_of_one_score_page_by_id_past_a_whole_chunk(flows: FlowClient, rclient: redis.Redis) -> None:
    """Ties (a batch of creates shares its time): more than one chunk (200) of them, in two tenants."""
    pipe = rclient.pipeline(transaction=False)
    for ns in ("plaita", "plaita:t1"):
        for i in range(450):
            doc = {"execution_id": f"tie-{i:03d}", "flow_id": "f", "status": "completed", "step": "s"}
            pipe.set(f"{ns}:execution:tie-{i:03d}", json.dumps(doc))
            pipe.zadd(f"{ns}:executions:status:completed", {f"tie-{i:03d}": 1000.0})
    pipe.sadd("plaita:tenants", "t1")
    pipe.execute()
    found = [(r.execution_id, r.tenant) for r in everything_of(flows, 83)]
    expected = [(f"tie-{i:03d}", t) for t in ("t1", "") for i in reversed(range(450))]
    assert found == expected  # (score, tenant, id) descending, none twice, none missed


def everything_of(flows: FlowClient, limit: int) -> list[ExecutionRow]:
    rows: list[ExecutionRow] = []
    page = flows.list(all_tenants=True, limit=limit)
    for _ in range(100):
        rows += page.rows
        if page.cursor is None:
            return rows
        page = flows.list(all_tenants=True, limit=limit, cursor=page.cursor)
    raise AssertionError("more than 100 pages")
