"""Least privilege for the flow operator's commands the producer may not run: fork, delete, prune,
cancel-many, resume-many and the schedule controls (pause, resume, trigger, backfill) under the documented
``plaita-flow-admin`` rules, with nothing denied; and the producer is still refused them."""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis

from plaita.store.acl import FLOW_ADMIN_ACL_RULES, PRODUCER_ACL_RULES
from tests.ops import test_security
from tests.ops.test_flow_acl import FORBIDDEN, stop, wait_status, worker_and_client
from tests.ops.test_security import OPERATIONS_DOC, MakeUser, _denials
from tests.support.ops import plaita, wait_until

pytestmark = pytest.mark.redis

acl_user = test_security.acl_user


def _cli(url: str, *args: str) -> Any:
    done = plaita(url, *args, timeout_s=60)  # a loaded machine: interpreter start and `--wait` included
    assert done.returncode == 0, f"plaita {' '.join(args)}: {done.stderr}"
    return json.loads(done.stdout) if "--json" in args else done.stdout


def _refused(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    done = plaita(url, *args, timeout_s=60)
    assert done.returncode != 0, f"plaita {' '.join(args)} ran under the producer: {done.stdout}"
    return done


class TestDocs:
    def test_docs_quote_the_rules_and_they_hold_no_dangerous_command(self) -> None:
        doc = OPERATIONS_DOC.read_text(encoding="utf-8")
        assert f"ACL SETUSER plaita-flow-admin reset on >CHANGE-ME {FLOW_ADMIN_ACL_RULES}" in doc
        assert not [f for f in FORBIDDEN if f in FLOW_ADMIN_ACL_RULES + " "], FLOW_ADMIN_ACL_RULES
        assert FLOW_ADMIN_ACL_RULES.startswith("resetkeys ~plaita:* resetchannels ")
        assert " -@all " in FLOW_ADMIN_ACL_RULES and "&" not in FLOW_ADMIN_ACL_RULES  # no channel at all


class TestFlowAdminAcl:
    @pytest.mark.timeout(240)  # a dozen CLI processes: each interpreter start is seconds on a loaded machine
    def test_fork_delete_prune_cancel_resume_many_and_schedule_controls(
        self, acl_user: MakeUser, rclient: redis.Redis, tmp_path: Path
    ) -> None:
        with worker_and_client(acl_user, tmp_path, "plaita-flow-admin", FLOW_ADMIN_ACL_RULES) as (proc, flows, url):
            done = _cli(url, "executions", "start", "acl-parent", "--input", '{"n": 1}', "--wait", "--json")
            assert done["status"] == "completed", done
            source = done["execution_id"]
            fork = _cli(url, "executions", "fork", source, "--from-step", "tally", "--json")
            assert flows.wait(fork["execution_id"], 30)["status"] == "completed"
            _cli(url, "executions", "delete", source)
            assert flows.get(source) is None
            _schedules(url, rclient)
            failed = flows.start("acl-failing")
            assert flows.wait(failed, 30)["status"] == "error"
            pruned = _cli(url, "executions", "prune", "--ended-before", "0s", "--status", "error", "--json")
            assert [r["deleted"] for r in pruned] == [1] and flows.get(failed) is None, pruned
            waiting = [flows.start("acl-waiter") for _ in range(3)]
            for eid in waiting:
                wait_status(flows, eid, "suspended")
            args = ("executions", "resume-many", "--flow", "acl-waiter", "--data", '{"go": 1}', "--limit", "1")
            (resumed,) = _cli(url, *args, "--yes", "--json")["execution_ids"]
            assert flows.wait(resumed, 30)["results"]["wait_event"] == {"resume": "event", "data": {"go": 1}}
            waiting.remove(resumed)
            args = ("executions", "cancel-many", "--status", "suspended", "--flow", "acl-waiter", "--yes", "--json")
            _cli(url, *args)
            assert [flows.wait(e, 30)["status"] for e in waiting] == ["cancelled", "cancelled"]
            stop(proc, tmp_path)
        assert _denials(rclient) == [], "no command of an operator's flow command may be denied"

    def test_the_producer_is_refused_them(self, acl_user: MakeUser, rclient: redis.Redis) -> None:
        """The producer keeps its narrow rules: deleting and pausing need the flow-admin user."""
        url = acl_user("plaita-producer", "producer-pw", PRODUCER_ACL_RULES)
        rclient.set("plaita:execution:gone", json.dumps({"status": "completed", "execution_id": "gone"}))
        for done in (_refused(url, "executions", "delete", "gone"), _refused(url, "schedules", "pause", "acl-tick")):
            assert "Traceback" not in done.stderr and "producer-pw" not in done.stderr, done.stderr
        assert rclient.exists("plaita:execution:gone") == 1
        assert not rclient.hexists("plaita:schedule:acl-tick", "paused")


def _schedules(url: str, rclient: redis.Redis) -> None:
    """pause, resume, trigger and a backfill of the once-a-second schedule of acl-tick."""
    wait_until(lambda: rclient.sismember("plaita:schedules", "acl-tick"), 30, "the keeper to record acl-tick")
    _cli(url, "schedules", "pause", "acl-tick")
    _cli(url, "schedules", "resume", "acl-tick")
    triggered = _cli(url, "schedules", "trigger", "acl-tick", "--json")
    assert triggered
    start = (datetime.now(UTC) - timedelta(seconds=3)).isoformat()
    _cli(url, "schedules", "backfill", "acl-tick", "--from", start, "--json")
    listed = _cli(url, "schedules", "list", "--json")
    assert "acl-tick" in json.dumps(listed)
