"""The DLQ page searches the whole DLQ, a bounded slice per request, and renders any entry.

Reproduction 9: the filter (and "requeue all matching") saw only the oldest 500 dead letters
and said "nothing matches" for one that existed; one envelope without ``payload`` made /dlq
answer 500. Every request here is checked for what it says it looked at, and the XRANGE calls
one request makes are counted on the server (INFO commandstats): bounded whatever the DLQ holds.
"""

from __future__ import annotations

import html
import json
import re
import time
from typing import Any

import redis

from plaita.dashboard.dlq_view import PAGE_ROWS, SCAN_ENTRIES
from plaita.store.streams.dlq import SCAN_CHUNK
from tests.dashboard.conftest import SAME_ORIGIN, MakeDashboard, dead_letter, login
from tests.support.ops import DLQ, QUEUE

NEEDLE = "needle-7c1e"


def _fill(client: redis.Redis, count: int, matches: dict[int, str]) -> list[str]:
    """``count`` dead letters (one pipeline); those at the positions of ``matches`` carry that reason."""
    pipe = client.pipeline(transaction=False)
    for n in range(count):
        envelope = {
            "reason": matches.get(n, f"processing_failed:RuntimeError:filler {n}"),
            "source_stream": QUEUE,
            "source_id": f"{n + 1}-0",
            "delivery_count": 3,
            "dead_lettered_at": time.time() - 60,
            "payload": {"type": "start", "n": n},
        }
        pipe.xadd(DLQ, {"payload": json.dumps(envelope)})
    return [i.decode() if isinstance(i, bytes) else str(i) for i in pipe.execute()]


def _listed(page: str) -> list[str]:
    return re.findall(r'<tr data-dlq-id="([^"]+)"', page)


def _xrange_calls(client: redis.Redis) -> int:
    stats: dict[str, Any] = client.info("commandstats")
    return int((stats.get("cmdstat_xrange") or {}).get("calls", 0))


def _continue_link(page: str) -> str | None:
    match = re.search(r'id="dlq-continue" href="([^"]+)"', page)
    return html.unescape(match.group(1)) if match else None


def test_a_match_beyond_the_oldest_500_is_found(make_dashboard: MakeDashboard, rclient: redis.Redis) -> None:
    ids = _fill(rclient, 600, {550: f"billing {NEEDLE} timeout"})
    dash = make_dashboard(allow_actions=False)
    page = dash.get("/dlq", params={"q": NEEDLE}).text
    assert _listed(page) == [ids[550]]
    assert f'Looked at 600 dead letter(s), <span class="mono">{ids[0]}</span> to' in page
    assert "That is the end of the DLQ." in page and _continue_link(page) is None


def test_each_request_looks_at_a_bounded_slice_and_continues_after_it(
    make_dashboard: MakeDashboard, rclient: redis.Redis
) -> None:
    total = SCAN_ENTRIES + 300
    ids = _fill(rclient, total, {10: f"a {NEEDLE}", SCAN_ENTRIES + 200: f"b {NEEDLE}"})
    dash = make_dashboard(allow_actions=False)
    before = _xrange_calls(rclient)
    first = dash.get("/dlq", params={"q": NEEDLE}).text
    calls = _xrange_calls(rclient) - before
    assert calls <= SCAN_ENTRIES // SCAN_CHUNK + 2, f"{calls} XRANGE calls for one page"
    assert _listed(first) == [ids[10]]
    assert f"Looked at {SCAN_ENTRIES} dead letter(s)" in first and ids[SCAN_ENTRIES - 1] in first
    link = _continue_link(first)
    assert link is not None and ids[SCAN_ENTRIES - 1] in link
    second = dash.get(link).text
    assert _listed(second) == [ids[SCAN_ENTRIES + 200]]
    assert "Looked at 300 dead letter(s)" in second and "That is the end of the DLQ." in second


def test_the_unfiltered_list_pages_too(make_dashboard: MakeDashboard, rclient: redis.Redis) -> None:
    ids = _fill(rclient, PAGE_ROWS + 5, {})
    dash = make_dashboard(allow_actions=False)
    first = dash.get("/dlq").text
    assert _listed(first) == ids[:PAGE_ROWS]
    link = _continue_link(first)
    assert link is not None
    assert _listed(dash.get(link).text) == ids[PAGE_ROWS:]


def test_requeue_all_matching_moves_only_the_range_the_page_showed(
    make_dashboard: MakeDashboard, rclient: redis.Redis
) -> None:
    ids = _fill(rclient, SCAN_ENTRIES + 300, {10: f"a {NEEDLE}", SCAN_ENTRIES + 200: f"b {NEEDLE}"})
    dash = make_dashboard()
    csrf = login(dash)
    first = dash.get("/dlq", params={"q": NEEDLE}).text
    assert "requeue all 1 matching" in first
    until = ids[SCAN_ENTRIES - 1]
    data = {"all_matching": "1", "q": NEEDLE, "after": "", "until": until, "csrf": csrf}
    notice = dash.post("/dlq/requeue", data=data, headers=SAME_ORIGIN).text
    assert "requeued 1 dead letter(s)" in notice and f"more beyond {until}" in notice
    dlq_ids = {e[0] for e in rclient.xrange(DLQ)}
    assert ids[10] not in dlq_ids and ids[SCAN_ENTRIES + 200] in dlq_ids and rclient.xlen(QUEUE) == 1
    data.update(after=until, until="")
    notice = dash.post("/dlq/requeue", data=data, headers=SAME_ORIGIN).text
    assert "requeued 1 dead letter(s)" in notice and "more beyond" not in notice
    assert ids[SCAN_ENTRIES + 200] not in {e[0] for e in rclient.xrange(DLQ)} and rclient.xlen(QUEUE) == 2
    assert rclient.xlen(DLQ) == SCAN_ENTRIES + 300 - 2
    bad = dash.post("/dlq/requeue", data={**data, "after": "<b>x"}, headers=SAME_ORIGIN).text
    assert "is not a DLQ id to continue from" in bad and "<b>x" not in bad


def test_every_envelope_shape_renders(make_dashboard: MakeDashboard, rclient: redis.Redis) -> None:
    shapes: list[dict[Any, Any]] = [
        {"payload": json.dumps({"reason": "no payload key", "delivery_count": 2})},
        {"payload": json.dumps({"payload": {"no": "reason"}})},
        {"payload": "{not json"},
        {"payload": json.dumps(["a", "list", "envelope"])},
        {"payload": json.dumps({"reason": ["a", {"list": 1}], "payload": None, "dead_lettered_at": "junk"})},
        {"payload": json.dumps({"reason": 7, "payload": {"x": 1}, "dead_lettered_at": 1e300, "delivery_count": "x"})},
        {"payload": '{"reason": "nan", "dead_lettered_at": NaN, "source_id": {"a": 1}}'},
        {"payload": json.dumps({"reason": "its own id", "dlq_id": "<script>x</script>", "payload": "p"})},
        {"payload": b"\xff\xfe\x00binary"},
        {"other": b"\xff", "fields": "only"},
        {"payload": json.dumps({"reason": "big", "payload": "y" * 200_000})},
    ]
    ids = [rclient.xadd(DLQ, fields) for fields in shapes]
    ids.append(dead_letter(rclient, reason=f"ordinary {NEEDLE}", payload={"n": 1}))
    dash = make_dashboard()
    csrf = login(dash)
    for path in ("/dlq", f"/dlq?q={NEEDLE}", "/dlq?q=list", "/dlq?q=%FF", "/dlq?after=1-0", "/dlq?after=junk"):
        r = dash.get(path)
        assert r.status_code == 200, (path, r.text[-500:])
    listing = dash.get("/dlq").text
    assert _listed(listing) == ids and "<script>x</script>" not in listing
    assert "(no payload)" in listing and "(no reason given)" in listing
    for dlq_id in ids:
        r = dash.get(f"/dlq/entry/{dlq_id}")
        assert r.status_code == 200 and "<script>x</script>" not in r.text, dlq_id
    r = dash.post("/dlq/requeue", data={"all_matching": "1", "q": "", "csrf": csrf}, headers=SAME_ORIGIN)
    assert r.status_code == 200 and f"requeued {len(ids)} dead letter(s)" in r.text
    assert rclient.xlen(DLQ) == 0 and rclient.xlen(QUEUE) == len(ids)


def test_a_partitioned_scan_resumes_across_partitions_without_gaps_or_repeats(redis_url: str) -> None:
    """Three DLQ partitions holding the same ids (5-0 in each): a scan of 7 at a time, continued
    from its own last id, visits every entry once, ordered by (id, partition)."""
    from plaita.config import Settings
    from plaita.store.streams.dlq import DeadLetterQueue
    from plaita.store.streams.partitioned import open_queue

    q = open_queue(Settings(redis_url=redis_url, queue_name=QUEUE, consumer_name="c", partitions=3))
    dlq = DeadLetterQueue(q)
    expected: list[tuple[int, int, int]] = []
    for p, part in enumerate(dlq.parts):
        for ms in (*range(1, 9), 5 + p * 3):
            if (ms, 0, p) in expected:
                continue
            q.client.xadd(part.dlq_key, {"payload": json.dumps({"reason": f"r{p}-{ms}"})}, id=f"{ms}-0")
            expected.append((ms, 0, p))
    seen: list[str] = []
    after: str | None = None
    for _ in range(50):  # bounded: 27 entries, 7 per call
        scan = dlq.scan(after=after, max_rows=100, max_scan=7)
        seen += [r["dlq_id"] for r in scan.rows]
        assert scan.scanned == len(scan.rows) <= 7
        if not scan.more:
            break
        after = scan.last_id
    assert seen == [f"{p}/{ms}-{seq}" for ms, seq, p in sorted(expected)]
    q.close()


def test_a_cursor_of_another_shape_is_a_message(make_dashboard: MakeDashboard, rclient: redis.Redis) -> None:
    """Well-formed ids that are not ids of this queue's DLQ (a partition it does not have, a
    partition on a queue without partitions) answer a message, never a 500 or a silent restart."""
    dead_letter(rclient, reason="r", payload={"n": 1})
    flat = make_dashboard(allow_actions=False)
    split = make_dashboard(allow_actions=False, partitions=3)
    for dash, after in ((split, "7/1-0"), (split, "1-0"), (flat, "2/1-0")):
        r = dash.get("/dlq", params={"after": after})
        assert r.status_code == 200 and 'id="page-error"' in r.text, (after, r.text[-300:])
        assert _listed(r.text) == []
