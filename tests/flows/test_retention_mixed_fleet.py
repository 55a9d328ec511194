"""A mixed fleet in one tenant (issue 33 item 6): workers of flows with different retentions
share the status indexes, and the terminal checkpoint of a worker of short flows never trims an
entry another worker's longer flow still owes; once no writer has used the longer keep for that
long, the short one trims again. A worker of flows kept for ever stops the trim."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.flows import flowdefs, retentiondefs
from tests.flows.support import Harness, start

pytestmark = pytest.mark.redis

MONTH_S = 30 * 86400
SHORT_S = 60
COMPLETED = "plaita:executions:status:completed"
KEEPS = "plaita:executions:index-keeps"


@pytest.fixture
def fleet(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Harness]]:
    """Three workers: ``short`` (ledger3, the default retention 60 s), ``month`` (30 days) and
    ``forever`` (kept for ever)."""
    monkeypatch.setenv("PLAITA_TEST_REDIS_URL", redis_url)
    workers = {
        "short": Harness(redis_url, flows=flowdefs.FLOWS, retention_s=SHORT_S),
        "month": Harness(redis_url, flows=[retentiondefs.month], retention_s=SHORT_S),
        "forever": Harness(redis_url, flows=[retentiondefs.forever], retention_s=SHORT_S),
    }
    try:
        yield workers
    finally:
        for h in workers.values():
            h.close()


def _age(h: Harness, eid: str, ago_s: float) -> None:
    h.client.zadd(COMPLETED, {eid: time.time() - ago_s})


def _listed(h: Harness) -> set[str]:
    return {m.decode() for m in h.client.zrange(COMPLETED, 0, -1)}


def test_a_short_retention_never_trims_entries_a_longer_flow_of_another_worker_owes(
    fleet: dict[str, Harness],
) -> None:
    short, month, forever = fleet["short"], fleet["month"], fleet["forever"]
    month.run(start("m1", "month"))
    short.run(start("old-a", "ledger3"))
    for eid in ("m1", "old-a"):
        _age(short, eid, 2 * 3600)  # past the short keep, well within the month's
    short.run(start("a1", "ledger3"))  # its terminal checkpoint trims the index
    assert {"m1", "a1"} <= _listed(short), "the month flow's entry stays for its own 30 days"
    assert 0 < short.client.ttl("plaita:execution:a1") <= SHORT_S and short.client.ttl("plaita:execution:m1") > 86400
    _age(short, "m1", MONTH_S + 3600)
    short.run(start("a2", "ledger3"))
    assert "m1" not in _listed(short), "past the longest keep owed, an entry goes"
    month.run(start("m2", "month"))
    _age(short, "m2", 2 * 3600)
    short.client.zadd(KEEPS, {str(MONTH_S): time.time() - MONTH_S - 1})  # no month worker for 30 days
    short.run(start("a3", "ledger3"))
    assert not {"m2", "old-a"} & _listed(short), "no writer owes the month keep: the short one trims again"
    assert [float(m) for m in short.client.zrange(KEEPS, 0, -1)] == [SHORT_S], "the stale keep is dropped"
    forever.run(start("f1", "forever"))
    _age(short, "f1", 2 * 3600)
    short.run(start("a4", "ledger3"))
    assert "f1" in _listed(short) and short.client.ttl("plaita:execution:f1") == -1, "kept for ever: never trimmed"
