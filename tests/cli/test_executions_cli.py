"""Issue 18, reproductions 5, 6 and 11 as an operator meets them: ``plaita executions list/show``
with unreadable execution keys, ``plaita keeper --once`` against a held lease, Redis flags after
a sub-subcommand, and argparse errors that never echo a password."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from plaita.cli.main import main
from plaita.config import DEFAULT_QUEUE_NAME

ROOT = Path(__file__).resolve().parents[2]
LEASE = "plaita:keeper:lease"
SECRET_URL = "redis://u:s3cretpw@127.0.0.1:1/0"


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLAITA_") and k != "REDIS_URL"}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, "-m", "plaita", "--quiet", *argv],
        cwd=str(ROOT), env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip


def one_line(r: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    return lines[0]


def put(client: redis.Redis, eid: str, status: str, **fields: object) -> None:
    doc = {"execution_id": eid, "flow_id": "f", "status": status, "step": "s", "updated_at": time.time(), **fields}
    client.set(f"plaita:execution:{eid}", json.dumps(doc))
    client.zadd(f"plaita:executions:status:{status}", {eid: time.time()})


@pytest.fixture
def bad(rclient: redis.Redis) -> dict[str, str]:
    """Unreadable executions in the indexes, by id: what each holds."""
    rclient.set("plaita:execution:a-corrupt", "garbage{")
    rclient.set("plaita:execution:a-list", "[1, 2]")
    rclient.hset("plaita:execution:a-hash", "status", "running")
    rclient.zadd("plaita:executions:status:running", {"a-corrupt": 1, "a-hash": 2})
    rclient.zadd("plaita:executions:status:completed", {"a-list": 3})
    return {"a-corrupt": "not JSON", "a-list": "not an object", "a-hash": "not a string key"}


@pytest.mark.redis
def test_list_names_each_unreadable_key_lists_the_others_and_writes_nothing(
    redis_url: str, rclient: redis.Redis, bad: dict[str, str]
) -> None:
    """Reproduction 6: one corrupt key made ``list`` a raw traceback; a wrong-typed one was
    deleted from the index by the read command."""
    put(rclient, "good", "completed")
    put(rclient, "odd", "running", updated_at="yesterday", step=["x"])  # an object, odd fields
    rclient.zadd("plaita:executions:status:error", {"expired": 4})  # state gone, index entry kept
    indexes = {s: rclient.zrange(f"plaita:executions:status:{s}", 0, -1) for s in ("running", "completed", "error")}
    r = run("executions", "list", "--redis-url", redis_url)
    assert r.returncode == 0, r.stderr
    assert "good" in r.stdout and "odd" in r.stdout
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 3, r.stderr
    for eid, what in bad.items():
        [line] = [x for x in lines if f"'{eid}'" in x]
        assert what in line and "Redis" not in line, line
    r = run("executions", "list", "--json", "--redis-url", redis_url)
    assert r.returncode == 0 and {d["execution_id"] for d in json.loads(r.stdout)} == {"good", "odd"}
    after = {s: rclient.zrange(f"plaita:executions:status:{s}", 0, -1) for s in ("running", "completed", "error")}
    assert after == indexes  # a read command never writes
    assert rclient.hget("plaita:execution:a-hash", "status") == "running"


@pytest.mark.redis
@pytest.mark.parametrize("eid", ["a-corrupt", "a-list", "a-hash"])
def test_show_of_an_unreadable_key_is_one_line_and_exit_1(
    redis_url: str, rclient: redis.Redis, bad: dict[str, str], eid: str
) -> None:
    """Reproduction 6: ``show`` of a corrupt key was a raw traceback (a hash one "Redis failed");
    ``cancel`` and ``resume`` of it refuse the same way and write nothing."""
    for argv in (("show", eid), ("show", eid, "--json"), ("cancel", eid), ("resume", eid, "--data", "1")):
        r = run("executions", *argv, "--redis-url", redis_url)
        assert r.returncode == 1, r.stderr
        line = one_line(r)
        assert eid in line and bad[eid] in line and "Redis" not in line, line
    assert rclient.exists(f"plaita:execution:cancel:{eid}") == 0 and rclient.xlen(DEFAULT_QUEUE_NAME) == 0


@pytest.mark.redis
def test_show_of_an_object_with_odd_fields_prints_it(redis_url: str, rclient: redis.Redis) -> None:
    put(rclient, "odd", "error", created_at="x", history=[1, {"step": "s", "started_at": "a"}], error="boom")
    for extra in ((), ("--json",)):
        r = run("executions", "show", "odd", *extra, "--redis-url", redis_url)
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
        assert "odd" in r.stdout


def test_json_output_is_strict_for_a_state_an_older_plaita_stored_with_nan(
    redis_url: str, rclient: redis.Redis
) -> None:
    """json.dumps writes NaN by default; strict parsers (jq, browsers) reject it."""
    put(rclient, "legacy-nan", "completed", state={"x": float("nan"), "y": [float("inf")]})

    def reject(constant: str) -> None:
        raise AssertionError(f"{constant} in --json output")

    for argv in (("show", "legacy-nan"), ("list",)):
        r = run("executions", *argv, "--json", "--redis-url", redis_url)
        assert r.returncode == 0, r.stderr
        json.loads(r.stdout, parse_constant=reject)
    shown = json.loads(run("executions", "show", "legacy-nan", "--json", "--redis-url", redis_url).stdout)
    assert shown["state"] == {"x": "NaN", "y": ["Infinity"]}


@pytest.mark.redis
def test_keeper_once_against_a_held_lease(redis_url: str, rclient: redis.Redis) -> None:
    """Reproduction 5: a --once that could not take the lease exited 0 in silence, and a dry run
    took (or waited for) the lease."""
    rclient.set(LEASE, "keeper:other:1", px=60_000)
    r = run("keeper", "--once", "--redis-url", redis_url)
    assert r.returncode == 1
    assert LEASE in one_line(r) and "keeper:other:1" in r.stderr
    r = run("keeper", "--once", "--dry-run", "--redis-url", redis_url)
    assert r.returncode == 0, r.stderr
    assert rclient.get(LEASE) == "keeper:other:1" and int(rclient.pttl(LEASE)) > 30_000
    rclient.delete(LEASE)
    r = run("keeper", "--once", "--dry-run", "--redis-url", redis_url)
    assert r.returncode == 0 and rclient.exists(LEASE) == 0, r.stderr


@pytest.mark.redis
def test_keeper_once_goes_past_a_corrupt_key(redis_url: str, rclient: redis.Redis) -> None:
    """Reproduction 6 as run: ``SET plaita:execution:a-corrupt 'garbage{'`` and ``ZADD
    plaita:executions:deadlines 1 a-corrupt`` stopped every pass ("Redis failed (JSONDecodeError")."""
    rclient.set("plaita:execution:a-corrupt", "garbage{")
    put(rclient, "due", "suspended", suspension={"seq": 1, "step": "s", "since": 0, "deadline": 1})
    rclient.zadd("plaita:executions:deadlines", {"a-corrupt": 1, "due": 1})
    r = run("keeper", "--once", "--redis-url", redis_url)
    assert r.returncode == 0 and "Redis failed" not in r.stderr, r.stderr
    assert "plaita:execution:a-corrupt" in one_line(r)
    [(_, fields)] = rclient.xrange(DEFAULT_QUEUE_NAME)
    body = json.loads(fields["payload"])
    assert (body["execution_id"], body["resume_type"], body["suspension"]) == ("due", "timeout", 1)


@pytest.mark.redis
def test_redis_flags_after_the_sub_subcommand(redis_url: str, rclient: redis.Redis) -> None:
    """Reproduction 11: ``executions list --redis-url URL`` was refused."""
    put(rclient, "late", "completed")
    r = run("executions", "list", "--redis-url", redis_url, "--queue-name", DEFAULT_QUEUE_NAME, "--partitions", "1")
    assert r.returncode == 0 and "late" in r.stdout, r.stderr
    r = run("executions", "show", "late", "--redis-url", redis_url)
    assert r.returncode == 0 and "late" in r.stdout, r.stderr
    r = run("executions", "show", "nope", "--redis-url", redis_url, "--partitions", "3")
    assert r.returncode == 1 and "nope" in one_line(r)
    r = run("dlq", "list", "--redis-url", redis_url, "--partitions", "1")
    assert r.returncode == 0, r.stderr
    for argv in (("executions", "list"), ("dlq", "list"), ("executions", "show", "x")):
        r = run(*argv, "--redis-url", redis_url, "--tls-ca-file", "/nonexistent/ca.pem")
        assert r.returncode == 2 and "--tls-ca-file" in one_line(r) and "cannot read" in r.stderr, r.stderr
    r = run("executions", "--redis-url", redis_url, "list", "--redis-url", redis_url)  # both places
    assert r.returncode == 0, r.stderr


EVERY_COMMAND = [
    ("worker",),
    ("enqueue",),
    ("workers",),
    ("status",),
    ("stop",),
    ("pause",),
    ("resume",),
    ("dlq",),
    ("dlq", "list"),
    ("dlq", "requeue"),
    ("executions",),
    ("executions", "list"),
    ("executions", "show", "x"),
    ("executions", "start", "f"),
    ("keeper",),
    ("dashboard",),
    ("diagram",),
    ("demo",),
]


@pytest.mark.parametrize("argv", EVERY_COMMAND, ids=" ".join)
@pytest.mark.parametrize(
    "mistake",
    [
        ("--no-such-flag", SECRET_URL),  # unrecognized arguments: echoes them
        (f"--no-such-flag={SECRET_URL}",),
        ("--log-level", SECRET_URL),  # invalid choice: echoes the value
    ],
    ids=["unrecognized", "unrecognized-equals", "invalid-choice"],
)
def test_argparse_errors_never_echo_a_password(
    argv: tuple[str, ...], mistake: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    """Reproduction 11: argparse echoed the URL, password included."""
    with pytest.raises(SystemExit) as exited:
        main([*argv, *mistake])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "s3cretpw" not in err and err.count("\n") == 1, err


@pytest.mark.parametrize(
    "argv",
    [
        (SECRET_URL,),
        ("worker", "--concurrency", SECRET_URL),
        ("executions", "list", "--partitions", SECRET_URL),
        ("executions", SECRET_URL),
        ("dlq", "list", "--count", SECRET_URL),
        ("keeper", "--interval-s", SECRET_URL),
        ("dashboard", "--port", SECRET_URL),
        ("worker", "--redis-url"),
    ],
    ids=lambda a: " ".join(a).replace(SECRET_URL, "URL"),
)
def test_argparse_bad_values_never_echo_a_password(argv: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(list(argv))
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "s3cretpw" not in err and err.strip(), err


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("x redis://u:pw@h:1/0 y", "x redis://u:***@h:1/0 y"),
        ("'rediss://:pw@h'", "'rediss://:***@h'"),
        ("redis://u:p@ss:w@h", "redis://u:***@h"),  # a password with @ and : in it
        ("redis+sentinel://:pw@a:1,b:2/m", "redis+sentinel://:***@a:1,b:2/m"),
        ("redis://u@h:6379 redis://h:1", "redis://u@h:6379 redis://h:1"),  # nothing to hide
    ],
)
def test_redact_text(text: str, shown: str) -> None:
    from plaita.config import redact_text

    assert redact_text(text) == shown


def test_executions_tenant_flag(redis_url: str, rclient: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--tenant T`` (before or after the action): starts, lists and shows tenant T's executions
    only; an invalid tenant id is exit 2 with one line."""
    from tests.flows.support import harness

    monkeypatch.setenv("PLAITA_TEST_REDIS_URL", redis_url)
    flags = ("--redis-url", redis_url, "--queue-name", DEFAULT_QUEUE_NAME)
    r = run("executions", "start", "ledger3", "--execution-id", "same", "--tenant", "t1", *flags)
    assert r.returncode == 0 and r.stdout.strip() == "same", r.stderr
    ((_, fields),) = rclient.xrange(DEFAULT_QUEUE_NAME)
    body = json.loads(fields["payload"])
    assert (body["execution_id"], body["tenant_id"]) == ("same", "t1")
    with harness(redis_url) as h:
        assert h.run(body) is not None
        h.run({"type": "start", "flow_id": "signup", "execution_id": "same", "params": {}})  # the default's
    r = run("executions", "--tenant", "t1", "list", "--json", *flags)
    assert r.returncode == 0, r.stderr
    assert [(d["execution_id"], d["status"]) for d in json.loads(r.stdout)] == [("same", "completed")]
    r = run("executions", "list", "--json", *flags)
    assert [(d["execution_id"], d["status"]) for d in json.loads(r.stdout)] == [("same", "suspended")]
    r = run("executions", "show", "same", "--json", "--tenant", "t1", *flags)
    assert r.returncode == 0 and json.loads(r.stdout)["flow_id"] == "ledger3", r.stderr
    r = run("executions", "show", "same", "--tenant", "t2", *flags)
    assert r.returncode == 1 and "same" in one_line(r)
    for bad in ("a:b", "{p0}", "x" * 65):
        r = run("executions", "list", "--tenant", bad, *flags)
        assert r.returncode == 2 and "--tenant: invalid tenant_id" in one_line(r)
