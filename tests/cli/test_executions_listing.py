"""``plaita executions list`` past its first page (``--limit``, paged through the status index,
``--flow`` included), across tenants (``--all-tenants``), and into a closed pipe (``| head -1``)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import redis

from plaita.flows.producer.client import FlowClient
from tests.cli.test_executions_cli import ROOT, one_line, put, run

pytestmark = pytest.mark.redis


def put_many(client: redis.Redis, n: int, status: str = "completed", **fields: object) -> None:
    pipe = client.pipeline(transaction=False)
    now = time.time()
    for i in range(n):
        eid = f"row-{fields.get('flow_id', 'f')}-{i:05d}"
        doc = {"execution_id": eid, "flow_id": "f", "status": status, "step": "s", "updated_at": now + i, **fields}
        pipe.set(f"plaita:execution:{eid}", json.dumps(doc))
        pipe.zadd(f"plaita:executions:status:{status}", {eid: now + i})
    pipe.execute()


def listed(redis_url: str, *args: str) -> list[dict[str, object]]:
    r = run("executions", "list", "--json", "--redis-url", redis_url, *args)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    rows: list[dict[str, object]] = json.loads(r.stdout)
    return rows


def test_limit_reads_past_the_first_page_newest_first(redis_url: str, rclient: redis.Redis) -> None:
    put_many(rclient, 450)
    assert len(listed(redis_url)) == 50  # the default
    rows = listed(redis_url, "--limit", "420")
    assert len(rows) == 420 and rows[0]["execution_id"] == "row-f-00449"
    stamps = [float(str(r["updated_at"])) for r in rows]
    assert stamps == sorted(stamps, reverse=True)
    assert len(listed(redis_url, "--limit", "1000")) == 450  # all there is
    assert len(listed(redis_url, "--count", "60")) == 60  # the older name


def test_a_flow_filter_pages_until_it_has_its_rows(redis_url: str, rclient: redis.Redis) -> None:
    put_many(rclient, 300)  # newer than the one row of flow g, so it is past the first page
    put(rclient, "the-g", "completed", flow_id="g", updated_at=1.0)
    rclient.zadd("plaita:executions:status:completed", {"the-g": 1.0})
    assert [r["execution_id"] for r in listed(redis_url, "--flow", "g")] == ["the-g"]


def test_all_tenants_lists_every_tenants_executions(redis_url: str) -> None:
    with FlowClient.from_url(redis_url) as flows:
        mine = flows.start("f")
        theirs = flows.for_tenant("t1").start("f")
        other = flows.for_tenant("t2").start("f")
    assert {r["execution_id"] for r in listed(redis_url)} == {mine}
    rows = listed(redis_url, "--all-tenants")
    assert {(r["execution_id"], r["tenant"]) for r in rows} == {(mine, "default"), (theirs, "t1"), (other, "t2")}
    table = run("executions", "list", "--all-tenants", "--redis-url", redis_url)
    assert table.stdout.startswith("TENANT") and "t2" in table.stdout
    both = run("executions", "list", "--all-tenants", "--tenant", "t1", "--redis-url", redis_url)
    assert both.returncode == 2 and "without --tenant" in one_line(both)


@pytest.mark.parametrize("limit", ["0", "100001", "many"])
def test_a_bad_limit_is_one_line_and_exit_2(redis_url: str, limit: str) -> None:
    r = run("executions", "list", "--limit", limit, "--redis-url", redis_url)
    assert r.returncode == 2 and "--limit" in one_line(r)


def test_a_table_piped_into_head_ends_quietly(redis_url: str, rclient: redis.Redis) -> None:
    put_many(rclient, 2000)
    shell = f"{sys.executable} -m plaita executions list --limit 2000 --redis-url {redis_url} | head -1"
    r = subprocess.run(
        ["bash", "-o", "pipefail", "-c", shell], cwd=str(ROOT), capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("EXECUTION") and r.stdout.count("\n") == 1
    assert r.stderr == "", r.stderr


def _cursor_of(stderr: str) -> str | None:
    marks = [line.split("--cursor ", 1)[1] for line in stderr.splitlines() if "more: --cursor " in line]
    return marks[0] if marks else None


def test_cursor_pages_on_where_the_last_list_stopped(redis_url: str, rclient: redis.Redis) -> None:
    """The CLI calls ``FlowClient.list``: more than a page of rows, then ``--cursor`` from stderr."""
    put_many(rclient, 120)
    seen: list[str] = []
    cursor: str | None = None
    for _ in range(10):
        extra = ("--cursor", cursor) if cursor else ()
        r = run("executions", "list", "--json", "--limit", "50", "--redis-url", redis_url, *extra)
        assert r.returncode == 0, r.stderr
        seen += [str(d["execution_id"]) for d in json.loads(r.stdout)]
        cursor = _cursor_of(r.stderr)
        if cursor is None:
            break
    assert seen == [f"row-f-{i:05d}" for i in reversed(range(120))]
    bad = run("executions", "list", "--cursor", "nonsense", "--redis-url", redis_url)
    assert bad.returncode == 2 and "cursor" in one_line(bad)


def test_filter_flags_select_as_the_python_api_does(redis_url: str, rclient: redis.Redis) -> None:
    with FlowClient.from_url(redis_url) as flows:
        early = flows.start("f", version="v1")
        mid_s = time.time() + 0.001
        while time.time() <= mid_s:  # bounded: the clock moves
            pass
        late = flows.start("g", version="v2")
    put(rclient, "kid", "completed", parent={"id": early}, created_at=time.time())
    assert [r["execution_id"] for r in listed(redis_url, "--version", "v2")] == [late]
    assert [r["execution_id"] for r in listed(redis_url, "--parent", early)] == ["kid"]
    assert [r["execution_id"] for r in listed(redis_url, "--created-before", repr(mid_s))] == [early]
    after = listed(redis_url, "--created-after", repr(mid_s), "--status", "queued")
    assert [(r["execution_id"], r["version"]) for r in after] == [(late, "v2")]
    assert {r["execution_id"] for r in listed(redis_url, "--created-after", "1h")} == {early, late, "kid"}
    assert listed(redis_url, "--created-before", "2000-01-01") == []
    r = run("executions", "list", "--created-after", "someday", "--redis-url", redis_url)
    assert r.returncode == 2 and "--created-after" in one_line(r)


def test_steps_prints_each_step_and_json(redis_url: str, rclient: redis.Redis) -> None:
    history = [
        {"step": "a", "attempt": 0, "started_at": 10.0, "ended_at": 11.0, "outcome": "ok"},
        {"step": "b", "attempt": 1, "started_at": 12.0, "ended_at": 13.0, "outcome": "failed", "error": "E: boom"},
        {"step": "b", "attempt": 2, "started_at": 14.0, "ended_at": 15.0, "outcome": "error", "error": "E: again"},
    ]
    put(rclient, "stepped", "error", step="b", history=history, results={"a": {"x": 1}})
    r = run("executions", "steps", "stepped", "--json", "--output", "--redis-url", redis_url)
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert [(d["name"], d["attempts"], d["outcome"], d["error"], d["output"]) for d in rows] == [
        ("a", 1, "ok", None, {"x": 1}),
        ("b", 2, "error", "E: again", None),
    ]
    assert rows[1]["started_at"] == 12.0 and rows[1]["ended_at"] == 15.0
    table = run("executions", "steps", "stepped", "--redis-url", redis_url)
    assert table.returncode == 0 and table.stdout.startswith("STEP") and "E: again" in table.stdout
    missing = run("executions", "steps", "nobody", "--redis-url", redis_url)
    assert missing.returncode == 1 and "nobody" in one_line(missing)
