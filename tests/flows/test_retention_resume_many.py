"""Bulk resume by filter (issue 33 item 6): ``resume-many`` resumes only the suspended executions
its flow and wait filter select (never a sleep), asks first, and a second run before the workers
took the first resumes nothing twice."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.flows import test_retention
from tests.flows.support import Harness, start
from tests.flows.test_retention import cli

pytestmark = pytest.mark.redis

h = test_retention.h  # the real flow engine over the test flows (msg-inbox too), fed tasks by hand


def _bodies(h: Harness) -> list[dict[str, Any]]:
    return [json.loads(f[b"payload"]) for _, f in h.client.xrange(h.queue.stream)]


def _suspended(h: Harness) -> None:
    """s1, s2 (signup, an unaddressed wait), g1 (msg-inbox, the wait ``go``), nap (a sleep),
    t1 (signup of tenant t1)."""
    for eid in ("s1", "s2"):
        h.run(start(eid, "signup"))
    h.run(start("g1", "msg-inbox", gate=True))
    h.run(start("nap", "napper", sleep_s=3600))
    h.run({**start("t1", "signup"), "tenant_id": "t1"})
    for eid in ("s1", "s2", "g1", "nap"):
        assert (h.store.get(eid) or {}).get("status") == "suspended", eid
    h.client.delete(h.queue.stream)


def test_resume_many_selects_by_flow_and_wait_never_a_sleep_and_runs_each_resume_once(h: Harness) -> None:
    _suspended(h)
    assert sorted(h.flows.resume_many(dry_run=True)) == ["g1", "s1", "s2"]  # not the sleeping nap
    assert sorted(h.flows.resume_many("signup", dry_run=True)) == ["s1", "s2"]
    assert h.flows.resume_many(wait_for="go", dry_run=True) == ["g1"]
    assert h.client.exists(h.queue.stream) == 0, "a dry run enqueues nothing"
    assert sorted(h.flows.resume_many("signup", data={"email": "x@y.z"})) == ["s1", "s2"]
    assert sorted(h.flows.resume_many("signup", data={"email": "x@y.z"})) == ["s1", "s2"]  # workers not there yet
    bodies = _bodies(h)
    assert len(bodies) == 4 and len({b["resume_id"] for b in bodies}) == 2, "the second run repeats the ids"
    for body in bodies:
        h.run(body)
    for eid in ("s1", "s2"):
        doc = h.store.get(eid) or {}
        assert doc["status"] == "completed" and doc["results"]["wait_email"]["email"] == {"email": "x@y.z"}, doc
        assert [e["outcome"] for e in doc["history"]].count("resumed") == 1, "resumed once"
    assert [(h.store.get(e) or {}).get("status") for e in ("g1", "nap")] == ["suspended", "suspended"]
    (go,) = h.flows.resume_many(wait_for="go")
    (body,) = _bodies(h)[4:]
    assert go == "g1" and body["wait_for"] == "go"
    with pytest.raises(ValueError, match="suspended executions can be resumed"):
        h.flows.resume_many(statuses=["running"])


def test_resume_many_from_the_cli_asks_first_and_goes_per_tenant(h: Harness, redis_url: str) -> None:
    _suspended(h)
    r = cli(redis_url, "resume-many", "--flow", "signup", "--data", '{"email": "a@b.c"}')
    assert r.returncode == 2 and "--yes" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert h.client.exists(h.queue.stream) == 0, "not confirmed: nothing enqueued"
    r = cli(redis_url, "resume-many", "--wait", "go", "--dry-run", "--json")
    assert r.returncode == 0 and json.loads(r.stdout) == {"dry_run": True, "execution_ids": ["g1"]}, r.stderr
    r = cli(redis_url, "resume-many", "--flow", "signup", "--all-tenants", "--dry-run", "--json")
    got = json.loads(r.stdout)
    assert sorted(got["execution_ids"]) == ["s1", "s2", "t1"] and got["tenants"]["t1"] == ["t1"], r.stdout
    r = cli(redis_url, "--tenant", "t1", "resume-many", "--yes", "--data", '"hi"')
    assert r.returncode == 0 and "resumed: 1 execution(s)" in r.stdout and "t1" in r.stdout, r.stdout + r.stderr
    (body,) = _bodies(h)
    assert body["tenant_id"] == "t1" and body["data"] == "hi"
    assert h.run(body)["status"] == "completed"  # type: ignore[index]
    for bad in (["--data", "{nope"], ["--limit", "0"], ["--status", "running"], ["--all-tenants", "--tenant", "t1"]):
        r = cli(redis_url, "resume-many", "--yes", *bad)
        assert r.returncode == 2 and "Traceback" not in r.stderr, (bad, r.returncode, r.stderr)
    assert len(_bodies(h)) == 1
