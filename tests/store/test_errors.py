"""Tier 1: ``plaita.store.errors`` sorts every exception into what the worker does about it. No Redis."""

from __future__ import annotations

import inspect
import socket

import pytest
import redis.exceptions as rx
from redis._parsers.base import BaseParser

from plaita.errors import BadTaskError, PlaitaError
from plaita.fsm import ErrorKind
from plaita.store.errors import cause, classify, is_redis_failure, refused_by_acl

T = ErrorKind.TRANSIENT
P = ErrorKind.PERSISTENT

#: Every exception class redis.exceptions defines (redis-py 8.x), and how plaita must treat it.
#: Written by hand: a class redis-py adds later fails test_expected_covers_every_redis_exception.
EXPECTED_REDIS_KINDS: dict[str, ErrorKind] = {
    # connection level: retry with backoff
    "ConnectionError": T,
    "TimeoutError": T,
    "BusyLoadingError": T,
    "MaxConnectionsError": T,
    "MaxClientsReachedError": T,  # redis-py >= 8.2: the server is at maxclients
    "InvalidResponse": T,
    "WatchError": T,
    # the server is temporarily unable to serve (failover, replica, cluster reshuffle)
    "ReadOnlyError": T,
    "TryAgainError": T,
    "ClusterError": T,
    "ClusterDownError": T,
    "MasterDownError": T,
    "AskError": T,
    "MovedError": T,
    "SlotNotCoveredError": T,
    "RedisClusterException": T,
    "RedisClusterUnreachableError": T,  # redis-py >= 8.2
    # an operator must act: credentials, ACLs, memory, scripts, modules, types
    "AuthenticationError": P,
    "AuthenticationWrongNumberOfArgsError": P,
    "AuthorizationError": P,
    "ExternalAuthProviderError": P,
    "NoPermissionError": P,
    "OutOfMemoryError": P,
    "NoScriptError": P,
    "ExecAbortError": P,
    "ModuleError": P,
    "NoSuchFieldsetError": P,
    "ClusterCrossSlotError": P,
    "CrossSlotTransactionError": P,
    "InvalidPipelineStack": P,
    "ChildDeadlockedError": P,
    "IncorrectPolicyType": P,
    "DataError": P,
    "PubSubError": P,
    "LockError": P,
    "LockNotOwnedError": P,
    # a bare reply error with no recognised code (e.g. "ERR unknown command") and the root class
    "ResponseError": P,
    "RedisError": P,
}

#: Classes whose constructor needs a specific message shape.
CTOR_ARGS: dict[str, tuple[str, ...]] = {
    "AskError": ("3999 127.0.0.1:6381",),
    "MovedError": ("3999 127.0.0.1:6381",),
}


def _redis_exception_classes() -> dict[str, type[BaseException]]:
    return {
        name: cls
        for name, cls in inspect.getmembers(rx, inspect.isclass)
        if issubclass(cls, BaseException) and cls.__module__.split(".")[0] == "redis"
    }


REDIS_CLASSES = _redis_exception_classes()


class TestRedisExceptionClasses:
    """One case per exception class redis-py defines."""

    def test_expected_covers_every_redis_exception(self) -> None:
        """The hand-written table names exactly the classes redis.exceptions defines, no more, no fewer."""
        assert set(REDIS_CLASSES) == set(EXPECTED_REDIS_KINDS)

    @pytest.mark.parametrize("name", sorted(REDIS_CLASSES))
    def test_class(self, name: str) -> None:
        """An instance of the class (with a message carrying no reply code) gets the expected kind."""
        assert name in EXPECTED_REDIS_KINDS, f"redis-py added {name}: decide its kind in store/errors.py and here"
        exc = REDIS_CLASSES[name](*CTOR_ARGS.get(name, ("boom",)))
        assert classify(exc) is EXPECTED_REDIS_KINDS[name]

    @pytest.mark.parametrize("name", sorted(REDIS_CLASSES))
    def test_subclass_inherits_kind(self, name: str) -> None:
        """An application subclass of a redis-py class is classified like its base."""
        sub = type(f"My{name}", (REDIS_CLASSES[name],), {"__module__": "app.errors"})
        assert classify(sub(*CTOR_ARGS.get(name, ("boom",)))) is EXPECTED_REDIS_KINDS[name]

    @pytest.mark.parametrize("name", ["TimeoutError", "ConnectionError", "ResponseError", "AuthenticationError"])
    def test_a_class_that_only_shares_a_redis_py_name_is_not_a_redis_failure(self, name: str) -> None:
        """Classes are matched by identity: a look-alike, even in a ``redis.*`` module, is not ours to retry."""
        lookalike = type(name, (Exception,), {"__module__": "redis.lookalike"})
        assert classify(lookalike("NOGROUP boom")) is ErrorKind.NOT_OURS
        assert is_redis_failure(lookalike("boom")) is False

    def test_redis_timeout_is_not_a_connection_error_but_transient(self) -> None:
        """In redis-py 8 TimeoutError is neither a redis ConnectionError nor an OSError; both are TRANSIENT."""
        assert not issubclass(rx.TimeoutError, rx.ConnectionError)
        assert not issubclass(rx.TimeoutError, OSError)
        assert classify(rx.TimeoutError("Timeout reading from socket")) is T
        assert classify(rx.ConnectionError("Error 111 connecting to 127.0.0.1:1. Connection refused.")) is T


class TestResponsePrefixes:
    """A plain ``ResponseError`` is classified by its reply code."""

    @pytest.mark.parametrize(
        ("reply", "kind"),
        [
            ("NOGROUP No such key 'q' or consumer group 'g' in XREADGROUP with GROUP option", T),
            ("LOADING Redis is loading the dataset in memory", T),
            ("READONLY You can't write against a read only replica.", T),
            ("TRYAGAIN Multiple keys request during rehashing of slot", T),
            ("CLUSTERDOWN The cluster is down", T),
            ("MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.", T),
            ("BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.", T),
            ("NOPERM User worker has no permissions to run the 'xreadgroup' command", P),
            ("WRONGTYPE Operation against a key holding the wrong kind of value", P),
            ("NOSCRIPT No matching script. Please use EVAL.", P),
            ("OOM command not allowed when used memory > 'maxmemory'.", P),
            ("ERR unknown command 'XFOO', with args beginning with: ", P),
            ("unknown command 'XFOO'", P),
            ("BUSYGROUP Consumer Group name already exists", P),
        ],
        ids=lambda v: v.split(" ")[0] if isinstance(v, str) else v.name,
    )
    def test_prefix(self, reply: str, kind: ErrorKind) -> None:
        """ResponseError(reply) gets the kind its leading code calls for (whole word: BUSYGROUP is not BUSY)."""
        assert classify(rx.ResponseError(reply)) is kind

    @pytest.mark.parametrize(
        ("raw", "kind"),
        [
            ("NOGROUP No such key 'q' or consumer group 'g'", T),
            ("LOADING Redis is loading the dataset in memory", T),
            ("READONLY You can't write against a read only replica.", T),
            ("TRYAGAIN Multiple keys request during rehashing of slot", T),
            ("CLUSTERDOWN The cluster is down", T),
            ("MASTERDOWN Link with MASTER is down", T),
            ("BUSY Redis is busy running a script.", T),
            ("ERR max number of clients reached", T),
            ("NOPERM User worker has no permissions", P),
            ("WRONGTYPE Operation against a key holding the wrong kind of value", P),
            ("NOSCRIPT No matching script. Please use EVAL.", P),
            ("OOM command not allowed when used memory > 'maxmemory'.", P),
            ("ERR unknown command 'XFOO'", P),
            ("NOAUTH Authentication required.", P),
            ("WRONGPASS invalid username-password pair or user is disabled.", P),
            ("EXECABORT Transaction discarded because of previous errors.", P),
        ],
        ids=lambda v: v.split(" ")[0] if isinstance(v, str) else v.name,
    )
    def test_reply_through_redis_parser(self, raw: str, kind: ErrorKind) -> None:
        """The exception redis-py's own reply parser builds from a raw error reply gets the expected kind."""
        assert classify(BaseParser.parse_error(raw)) is kind


class TestNonRedisExceptions:
    """Socket errors, bad input and everything else."""

    @pytest.mark.parametrize(
        "exc",
        [
            socket.timeout("timed out"),  # noqa: UP041 - the alias is what socket code raises
            ConnectionResetError(104, "Connection reset by peer"),
            BrokenPipeError(32, "Broken pipe"),
            ConnectionRefusedError(111, "Connection refused"),
            OSError(113, "No route to host"),
        ],
        ids=["socket.timeout", "ConnectionResetError", "BrokenPipeError", "ConnectionRefusedError", "OSError"],
    )
    def test_socket_errors_are_transient(self, exc: BaseException) -> None:
        """Raw socket failures are TRANSIENT and count as Redis failures."""
        assert classify(exc) is T
        assert is_redis_failure(exc) is True

    def test_bad_task_is_bad_input(self) -> None:
        """plaita.errors.BadTaskError (and subclasses) is BAD_INPUT, not a Redis failure."""

        class OversizedTask(BadTaskError):
            pass

        for exc in (BadTaskError("payload is not JSON"), OversizedTask("too big")):
            assert classify(exc) is ErrorKind.BAD_INPUT
            assert is_redis_failure(exc) is False

    @pytest.mark.parametrize(
        "exc",
        [ValueError("bad"), KeyError("k"), RuntimeError("bug"), ZeroDivisionError(), PlaitaError("other")],
        ids=["ValueError", "KeyError", "RuntimeError", "ZeroDivisionError", "PlaitaError"],
    )
    def test_everything_else_is_not_ours(self, exc: BaseException) -> None:
        """Programming errors and handler bugs are NOT_OURS and not Redis failures."""
        assert classify(exc) is ErrorKind.NOT_OURS
        assert is_redis_failure(exc) is False

    def test_is_redis_failure_matches_kinds(self) -> None:
        """is_redis_failure is true exactly for TRANSIENT and PERSISTENT."""
        assert is_redis_failure(rx.ConnectionError("down")) is True
        assert is_redis_failure(rx.ResponseError("WRONGTYPE Operation")) is True
        assert is_redis_failure(BadTaskError("x")) is False
        assert is_redis_failure(RuntimeError("x")) is False


@pytest.mark.parametrize(
    "reply",
    [
        "NOPERM User u has no permissions to run the 'zrem' command",
        "The user executing the script can't run this command or subcommand script: abc, on @user_script:28.",
        "ACL failure in script: User u has no permissions to run the 'zrangebyscore' command script: on @user_script:1",
    ],
)
def test_a_command_refused_by_the_acl_is_known_on_redis_and_on_valkey(reply: str) -> None:
    """Both servers' words for a refused command (bare, and inside a script), as their parsers raise
    them; /readyz and the logs name the ACL as the cause of each."""
    assert refused_by_acl(BaseParser.parse_error(reply))
    assert cause(BaseParser.parse_error(reply)) == "acl"


def test_other_errors_are_not_acl_refusals() -> None:
    assert not refused_by_acl(
        BaseParser.parse_error("WRONGTYPE Operation against a key holding the wrong kind of value")
    )
    assert not refused_by_acl(BaseParser.parse_error("ERR Error running script: attempt to index a nil value"))
    assert cause(BaseParser.parse_error("ERR Error running script: attempt to index a nil value")) == ""
