"""``describe_failure``: the operator's cause for each Redis refusal, and OOM classified. No Redis."""

from __future__ import annotations

import redis.exceptions as rx
from redis._parsers.base import BaseParser

from plaita.errors import BadTaskError
from plaita.fsm import ErrorKind
from plaita.store.errors import classify, describe_failure


def parsed(reply: str) -> rx.RedisError:
    """The exception redis-py builds for an error reply, exactly as on the wire."""
    return BaseParser.parse_error(reply)  # type: ignore[no-any-return]


OOM_REPLY = "OOM command not allowed when used memory > 'maxmemory'."


def test_oom_is_persistent_and_named_as_out_of_memory() -> None:
    """Reproduction 8: an OOM was logged as 'check credentials, ACL and key types'."""
    exc = parsed(OOM_REPLY)
    assert classify(exc) is ErrorKind.PERSISTENT
    text = describe_failure(exc)
    assert text.startswith("Redis is out of memory (maxmemory)")
    assert "credentials" not in text


def test_oom_inside_a_script_error_is_still_out_of_memory() -> None:
    exc = rx.ResponseError(
        "Error running script (call to f_x): @user_script:2: OOM command not allowed when used memory > 'maxmemory'."
    )
    assert describe_failure(exc).startswith("Redis is out of memory (maxmemory)")


def test_each_refusal_has_its_own_cause() -> None:
    causes = {
        "WRONGPASS invalid username-password pair or user is disabled.": "credentials",
        "NOAUTH Authentication required.": "requires a password",
        "NOPERM User u has no permissions to run the 'xadd' command": "ACL NOPERM",
        "WRONGTYPE Operation against a key holding the wrong kind of value": "WRONGTYPE",
        "READONLY You can't write against a read only replica.": "read-only replica",
        "MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist": "MISCONF",
        "LOADING Redis is loading the dataset in memory": "loading",
        "BUSY Redis is busy running a script.": "busy",
        "NOGROUP No such key 'q' or consumer group 'g'": "NOGROUP",
    }
    texts = {reply: describe_failure(parsed(reply)) for reply in causes}
    for reply, needle in causes.items():
        assert needle in texts[reply], (reply, texts[reply])
    assert len({t.split(" (")[0] for t in texts.values()}) == len(causes)  # no two share a cause


def test_connection_failures() -> None:
    assert "did not answer in time" in describe_failure(rx.TimeoutError("Timeout reading from socket"))
    assert "unreachable" in describe_failure(rx.ConnectionError("Error 111 connecting"))
    assert "unreachable" in describe_failure(ConnectionResetError(104, "reset"))


def test_bad_task_and_bugs_are_not_blamed_on_redis() -> None:
    assert describe_failure(BadTaskError("no payload")).startswith("bad task")
    assert "Redis" not in describe_failure(KeyError("x"))


def test_long_messages_are_cut() -> None:
    text = describe_failure(rx.ResponseError("ERR " + "x" * 10_000))
    assert len(text) < 400
