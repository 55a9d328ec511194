"""Least privilege and secrets: the documented ACLs suffice, bad credentials degrade safely, no password leaks."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from plaita.store.acl import ADMIN_ACL_RULES, MINIMAL_ACL_RULES, WORKER_ACL_RULES, setuser_command
from tests.support.ops import (
    DLQ,
    QUEUE,
    REGISTRY_PREFIX,
    clean_env,
    enqueue,
    ops_worker,
    plaita,
    plaita_json,
    plaita_many,
    task,
    wait_until,
)
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.redis

ROOT = Path(__file__).resolve().parents[2]
OPERATIONS_DOC = ROOT / "docs" / "operations.md"
#: Seconds the wrong-credentials worker is watched for a busy loop (> one persistent backoff of 5 s).
WATCH_S = 6.0

MakeUser = Callable[[str, str, str], str]


@pytest.fixture
def acl_user(redis_server: RedisServer, redis_url: str) -> Iterator[MakeUser]:
    """Create ACL users on the shared private server (URL returned); deleted afterwards."""
    admin = redis_server.client(decode_responses=True)
    admin.execute_command("ACL", "LOG", "RESET")
    created: list[str] = []

    def make(user: str, password: str, rules: str) -> str:
        admin.execute_command(*setuser_command(user, password, rules))
        created.append(user)
        return f"redis://{user}:{password}@127.0.0.1:{redis_server.port}/0"

    yield make
    for user in created:
        admin.execute_command("ACL", "DELUSER", user)
    admin.close()


def _denials(client: redis.Redis) -> list[dict[str, object]]:
    return [dict(e) for e in client.acl_log() if e.get("reason") != "auth"]


class TestDocumentedAcl:
    def test_docs_quote_the_rules_the_tests_use(self) -> None:
        """docs/operations.md carries the exact ACL SETUSER lines proven below."""
        doc = OPERATIONS_DOC.read_text(encoding="utf-8")
        assert MINIMAL_ACL_RULES == WORKER_ACL_RULES
        assert f"ACL SETUSER plaita-worker reset on >CHANGE-ME {WORKER_ACL_RULES}" in doc
        assert f"ACL SETUSER plaita-admin reset on >CHANGE-ME {ADMIN_ACL_RULES}" in doc

    def test_worker_and_admin_users_run_a_full_cycle(
        self, acl_user: MakeUser, rclient: redis.Redis, tmp_path: Path
    ) -> None:
        """Under the minimal ACLs: consume, lease, reclaim, DLQ, registry, status, hand-back and stop; no denial."""
        worker_url = acl_user("plaita-worker", "worker-pw", WORKER_ACL_RULES)
        admin_url = acl_user("plaita-admin", "admin-pw", ADMIN_ACL_RULES)
        # An abandoned delivery for RECLAIMING to take over.
        rclient.xgroup_create(QUEUE, "plaita-workers", id="0", mkstream=True)
        ghost_id = enqueue(rclient, task(100))
        rclient.xreadgroup("plaita-workers", "ghost", {QUEUE: ">"}, count=1)
        extra = ("--max-deliveries", "2", "--claim-min-idle-ms", "200", "--reclaim-interval-s", "0.2")
        # The ghost silent past 2 reads' BLOCK + 1 s (1.4 s here) is a dead worker whatever the
        # worker's start-up time: its task is a crash suspect, run uncharged (the ISOLATING path
        # under the ACL too). Sooner, it would be a live consumer's stuck entry, charged: which one
        # depended on how fast the worker started, and the test failed on a loaded machine.
        wait_until(lambda: _consumer_idle_ms(rclient, "ghost") >= 1600, 10, "the ghost silent long enough to be dead")
        with ops_worker(worker_url, tmp_path, *extra) as w:
            wait_until(lambda: ghost_id in w.done_ids(), 5, "the abandoned task to be reclaimed and run")
            assert [(m, d) for e, m, _n, d in w.executions() if e == "start" and m == ghost_id] == [(ghost_id, 1)]
            ok = [enqueue(rclient, task(n)) for n in range(3)]
            enqueue(rclient, task(9, fail=True))
            enqueue(rclient, "not json")
            wait_until(lambda: set(ok) <= w.done_ids() and rclient.xlen(DLQ) == 2, 5, "3 done, 2 dead letters")
            slow = enqueue(rclient, {**task(7, sleep_s=30), "execution_id": "exec-7"})
            wait_until(lambda: slow in w.started_ids(), 5, "the slow task to start")
            assert rclient.exists("plaita:execution:lease:exec-7"), "the running task holds its execution lease"

            assert plaita_json(admin_url, "workers")[0]["instance_id"] == w.instance_id
            assert plaita_json(admin_url, "status")["dlq_length"] == 2
            # RECLAIMING comes every 0.2 s here: wait for the steady state instead of sampling it.
            wait_until(
                lambda: plaita_json(admin_url, "status", w.instance_id)["state"] == "READING",
                10,
                "the admin user's `status INSTANCE` to answer READING",
            )
            assert len(plaita_json(admin_url, "dlq", "list")) == 2
            stop = plaita(admin_url, "stop", w.instance_id, "--now")
            assert stop.returncode == 0, stop.stderr
            assert w.wait_exit(5) == 0
            log = w.stderr()
        assert "handed back 1 task(s)" in log, log
        assert "NOPERM" not in log and "refused" not in log and "could not" not in log, log
        assert rclient.exists(REGISTRY_PREFIX + w.instance_id) == 0
        assert not rclient.keys("plaita:execution:lease:*"), "hand-back released the lease"
        assert _denials(rclient) == [], "no command of the cycle may be denied, not even an ignored one"


class TestWrongCredentials:
    def test_auth_failure_is_reported_slowly_and_heals_without_restart(
        self, acl_user: MakeUser, rclient: redis.Redis, tmp_path: Path
    ) -> None:
        """Wrong password: error log with the cause, /readyz 503 "auth…", no busy loop; fixed on the server, it runs."""
        password = f"right-{uuid.uuid4().hex}"
        url = acl_user("plaita-worker", "something-else", WORKER_ACL_RULES).replace("something-else", password)
        with ops_worker(url, tmp_path, wait_ready=False) as w:

            def auth_unready() -> str | None:
                w.assert_alive()
                r = w.readyz()
                return r[1] if r is not None and r[0] == 503 and r[1].startswith("auth") else None

            reason = wait_until(auth_unready, 15, '/readyz 503 "auth: …"')
            assert "AuthenticationError" in reason or "WRONGPASS" in reason, reason
            lines_before = len(w.stderr().splitlines())
            time.sleep(WATCH_S)  # an observation window: the worker must stay quiet during it
            watched = w.stderr().splitlines()[lines_before:]
            refusals = [line for line in watched if "Redis refused" in line]
            assert 1 <= len(refusals) <= 3, f"retries bounded by the 5 s persistent backoff:\n{watched}"
            assert len(watched) <= 6, f"no log flood while auth fails:\n{watched}"
            assert "invalid username-password" in refusals[0] or "WRONGPASS" in refusals[0], refusals[0]

            rclient.execute_command("ACL", "SETUSER", "plaita-worker", f">{password}")
            w.wait_ready(10)
            done = enqueue(rclient, task(1))
            wait_until(lambda: done in w.done_ids(), 5, "a task after the credentials were fixed")
            assert w.terminate() == 0
            log = w.stderr()
        assert password not in log


def _cli_outputs(admin_url: str, admin_pw: str, instance_id: str, dlq_id: str) -> list[str]:
    """Every read-only CLI command, pause/resume and a wrong password: their stdout and stderr."""
    outputs: list[str] = []
    commands: list[tuple[str, ...]] = [
        ("workers",), ("workers", "--json"), ("status",), ("status", "--json"),
        ("status", instance_id), ("status", instance_id, "--json"),
        ("dlq", "list"), ("dlq", "list", "--json"), ("dlq", "show", dlq_id), ("dlq", "show", "1-1"),
        ("dlq", "purge"), ("enqueue", json.dumps(task(2))), ("stop", "no-such-worker"),
    ]  # fmt: skip
    for code, out, err in plaita_many(admin_url, commands):
        assert code in (0, 1), (code, err)
        outputs += [out, err]
    for verb in ("pause", "resume"):
        done = plaita(admin_url, verb, instance_id)
        assert done.returncode == 0, done.stderr
        outputs += [done.stdout, done.stderr]
    wrong = plaita(admin_url.replace(admin_pw, admin_pw + "x"), "workers")
    assert wrong.returncode == 1 and "plaita-admin:***@" in wrong.stderr, wrong.stderr
    return [*outputs, wrong.stdout, wrong.stderr]


def _bad_port_outputs(worker_pw: str) -> list[str]:
    """A worker started with a bad URL quoting the password: its usage error's output."""
    bad_port = subprocess.run(
        [sys.executable, "-m", "plaita", "worker", "--redis-url", f"redis://u:{worker_pw}@127.0.0.1:notaport/0"],
        cwd=str(ROOT), env=clean_env(), stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=20,
        check=False,
    )  # fmt: skip
    assert bad_port.returncode == 2
    return [bad_port.stdout, bad_port.stderr]


class TestSecrets:
    @pytest.mark.timeout(240)  # a dozen CLI processes and a worker: over the 60 s default on a loaded machine
    def test_passwords_never_appear_in_any_output(
        self, acl_user: MakeUser, rclient: redis.Redis, tmp_path: Path
    ) -> None:
        """Every CLI command, the worker log, status file, registry, metrics and status reply omit the password."""
        worker_pw, admin_pw = f"wpw-{uuid.uuid4().hex}", f"apw-{uuid.uuid4().hex}"
        worker_url = acl_user("plaita-worker", worker_pw, WORKER_ACL_RULES)
        admin_url = acl_user("plaita-admin", admin_pw, ADMIN_ACL_RULES)
        outputs: list[str] = []
        with ops_worker(worker_url, tmp_path, "--max-deliveries", "1", "--log-level", "DEBUG") as w:
            enqueue(rclient, task(1, fail=True))
            wait_until(lambda: rclient.xlen(DLQ) == 1, 5, "a dead letter")
            dlq_id = plaita_json(admin_url, "dlq", "list")[0]["dlq_id"]
            outputs += _cli_outputs(admin_url, admin_pw, w.instance_id, dlq_id)
            outputs.append(w.http("/metrics")[1])
            outputs.append(w.http("/readyz")[1])
            outputs.append(w.status_file.read_text(encoding="utf-8"))
            outputs.append(str(rclient.get(REGISTRY_PREFIX + w.instance_id)))
            requeued = plaita(admin_url, "dlq", "requeue", dlq_id, "--json")
            purged = plaita(admin_url, "dlq", "purge", "--yes")
            stopped = plaita(admin_url, "stop", w.instance_id)
            assert stopped.returncode == 0, stopped.stderr
            outputs += [requeued.stdout, requeued.stderr, purged.stdout, purged.stderr, stopped.stdout, stopped.stderr]
            assert w.wait_exit(5) == 0
            outputs.append(w.stderr())
            outputs.append(w.status_file.read_text(encoding="utf-8"))
        outputs += _bad_port_outputs(worker_pw)
        joined = "\n".join(outputs)
        assert "worker_url" not in joined and len(joined) > 2000, "the outputs were really collected"
        assert worker_pw not in joined and admin_pw not in joined
        assert "***" in w.stderr(), "the worker names its Redis with the password redacted"


def _consumer_idle_ms(client: redis.Redis, consumer: str) -> int:
    rows = client.xinfo_consumers(QUEUE, "plaita-workers")
    return next(int(r["idle"]) for r in rows if r["name"] == consumer)
