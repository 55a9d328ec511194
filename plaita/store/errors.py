"""Sort exceptions into what the worker does about them (retry quietly, retry slowly and shout,
or DLQ) and say in words what an operator must look at.

This is where Redis's error vocabulary lives: redis-py's exception classes and the reply codes
of a plain ``ResponseError``. The lifecycle (``plaita.fsm``) only knows the resulting
``ErrorKind``. Classes are matched by identity along the exception's MRO, most specific first,
so an application's subclass of a redis-py class is treated like its base.
"""

from __future__ import annotations

import redis.exceptions as rx

from plaita.errors import BadTaskError
from plaita.fsm.kinds import ErrorKind

T, P = ErrorKind.TRANSIENT, ErrorKind.PERSISTENT

#: redis-py exception class -> kind. Order of lookup is the MRO, most specific first.
REDIS_CLASS_KINDS: dict[type[BaseException], ErrorKind] = {
    rx.AuthenticationError: P,
    rx.AuthenticationWrongNumberOfArgsError: P,
    rx.AuthorizationError: P,
    rx.ExternalAuthProviderError: P,
    rx.NoPermissionError: P,
    rx.BusyLoadingError: T,
    rx.MaxConnectionsError: T,
    rx.ConnectionError: T,
    rx.TimeoutError: T,
    rx.InvalidResponse: T,
    rx.ReadOnlyError: T,
    rx.TryAgainError: T,
    rx.MasterDownError: T,
    rx.ClusterDownError: T,
    rx.ClusterError: T,
    rx.AskError: T,
    rx.MovedError: T,
    rx.SlotNotCoveredError: T,
    rx.WatchError: T,
    rx.OutOfMemoryError: P,
    rx.NoScriptError: P,
    rx.ExecAbortError: P,
    rx.ModuleError: P,
    rx.ClusterCrossSlotError: P,
    rx.CrossSlotTransactionError: P,
    rx.InvalidPipelineStack: P,
    rx.RedisClusterException: T,
    rx.ChildDeadlockedError: P,
    rx.IncorrectPolicyType: P,
    rx.DataError: P,
    rx.PubSubError: P,
    rx.LockNotOwnedError: P,
    rx.LockError: P,
    rx.RedisError: P,
}
#: Classes of later redis-py releases (plaita also runs on 8.0, which lacks them): 8.1 added
#: NoSuchFieldsetError; 8.2 MaxClientsReachedError (the server is at ``maxclients``: a client
#: disconnects soon, retry) and RedisClusterUnreachableError (no node of the cluster answers).
_LATER_CLASS_KINDS = {"NoSuchFieldsetError": P, "MaxClientsReachedError": T, "RedisClusterUnreachableError": T}
for _name, _kind in _LATER_CLASS_KINDS.items():
    _cls: type[BaseException] | None = getattr(rx, _name, None)
    if _cls is not None:
        REDIS_CLASS_KINDS[_cls] = _kind

#: Error-reply prefixes that a plain ``ResponseError`` may carry, and their kind.
RESPONSE_PREFIX_KINDS: dict[str, ErrorKind] = {
    "NOGROUP": T,  # stream or group gone after a restart without data: recreate the group
    # A blocked XREADGROUP whose stream key was deleted (Redis >= 7): same cure as NOGROUP.
    "UNBLOCKED": T,
    "LOADING": T,
    "READONLY": T,
    "TRYAGAIN": T,
    "CLUSTERDOWN": T,
    "MASTERDOWN": T,
    "BUSY": T,  # a long Lua script is running on the server
    "NOPERM": P,
    "WRONGTYPE": P,
    "NOSCRIPT": P,
    "OOM": P,
    "NOAUTH": P,
    "WRONGPASS": P,
}


def response_code(exc: BaseException) -> str:
    """The leading upper-case word of a Redis error reply (``NOGROUP``, ``WRONGTYPE`` …)."""
    text = str(exc).lstrip()
    word = text.split(" ", 1)[0] if text else ""
    return word if word.isupper() else ""


#: Texts of a failed TLS handshake that waiting will not fix (redis-py wraps them in a
#: ConnectionError): the operator must fix a CA, a certificate or the URL.
TLS_REFUSALS = ("CERTIFICATE_VERIFY_FAILED", "certificate verify failed", "WRONG_VERSION_NUMBER", "SSLV3_ALERT")


def is_tls_refusal(exc: BaseException) -> bool:
    text = str(exc)
    return any(marker in text for marker in TLS_REFUSALS)


def classify(exc: BaseException) -> ErrorKind:
    """Decide how the worker treats ``exc``."""
    if isinstance(exc, BadTaskError):
        return ErrorKind.BAD_INPUT
    if is_tls_refusal(exc):
        return ErrorKind.PERSISTENT
    for cls in type(exc).__mro__:
        if cls is rx.ResponseError:
            return RESPONSE_PREFIX_KINDS.get(response_code(exc), P)
        kind = REDIS_CLASS_KINDS.get(cls)
        if kind is not None:
            return kind
    # socket.timeout is the builtin TimeoutError, an OSError; resets and refusals are OSErrors.
    if isinstance(exc, OSError):
        return ErrorKind.TRANSIENT
    return ErrorKind.NOT_OURS


def is_redis_failure(exc: BaseException) -> bool:
    """True when ``exc`` is a Redis-side failure (transient or persistent)."""
    return classify(exc) in (ErrorKind.TRANSIENT, ErrorKind.PERSISTENT)


#: Classes (anywhere in the MRO) and reply codes that mean "who you are" was refused.
_AUTH_CLASSES: frozenset[type[BaseException]] = frozenset(
    {rx.AuthenticationError, rx.AuthenticationWrongNumberOfArgsError, rx.AuthorizationError}
)
_AUTH_CODES = frozenset({"WRONGPASS", "NOAUTH"})


def cause(exc: BaseException) -> str:
    """What an operator must look at: ``auth`` (credentials), ``acl`` (permissions), else ``""``."""
    classes = set(type(exc).__mro__)
    code = response_code(exc)
    if classes & _AUTH_CLASSES or code in _AUTH_CODES:
        return "auth"
    if rx.NoPermissionError in classes or code == "NOPERM" or _refused_in_script(exc):
        return "acl"
    if is_tls_refusal(exc):
        return "tls"
    return ""


#: Operator cause per Redis error code: what is wrong and, where it is not obvious, what to do.
CAUSES_BY_CODE: dict[str, str] = {
    "OOM": "Redis is out of memory (maxmemory): free memory, raise maxmemory or allow eviction",
    "WRONGPASS": "Redis rejected the credentials (wrong user or password)",
    "NOAUTH": "Redis requires a password and none was given",
    "NOPERM": "the Redis user lacks a permission (ACL NOPERM): grant the command or key pattern",
    "WRONGTYPE": "a key holds the wrong type of value (WRONGTYPE): something else wrote a key plaita uses",
    "READONLY": "Redis is a read-only replica (READONLY): point the worker at the primary",
    "MISCONF": "Redis cannot save to disk and refuses writes (MISCONF): fix its persistence",
    "LOADING": "Redis is loading its dataset into memory",
    "BUSY": "Redis is busy running a long script",
    "NOSCRIPT": "a Lua script is missing from the server's cache (NOSCRIPT)",
    "NOGROUP": "the stream or its consumer group is missing (NOGROUP)",
    "UNBLOCKED": "the stream was deleted during a blocking read",
    "EXECABORT": "Redis refused a command of a transaction (EXECABORT)",
    "MASTERDOWN": "the replica lost its primary (MASTERDOWN)",
    "CLUSTERDOWN": "the Redis cluster is down (CLUSTERDOWN)",
    "TRYAGAIN": "the Redis cluster is resharding (TRYAGAIN)",
    "MOVED": "this Redis is a cluster node (MOVED): use --redis-url redis+cluster://HOST:PORT[,HOST:PORT]",
    "ASK": "this Redis is a cluster node (ASK): use --redis-url redis+cluster://HOST:PORT[,HOST:PORT]",
    "CROSSSLOT": "one command touched keys of several cluster slots (CROSSSLOT): a key lacks its hash tag",
}

#: Operator cause per redis-py class, for failures without an error code.
CAUSES_BY_CLASS: dict[type[BaseException], str] = {
    rx.AuthenticationError: "Redis rejected the credentials (wrong user or password)",
    rx.AuthenticationWrongNumberOfArgsError: "Redis rejected the credentials (this server takes no user name)",
    rx.AuthorizationError: "the Redis user is not authorised",
    rx.NoPermissionError: CAUSES_BY_CODE["NOPERM"],
    rx.OutOfMemoryError: CAUSES_BY_CODE["OOM"],
    rx.BusyLoadingError: CAUSES_BY_CODE["LOADING"],
    rx.ReadOnlyError: CAUSES_BY_CODE["READONLY"],
    rx.NoScriptError: CAUSES_BY_CODE["NOSCRIPT"],
    rx.ExecAbortError: CAUSES_BY_CODE["EXECABORT"],
    rx.TimeoutError: "Redis did not answer in time (frozen, overloaded or network loss)",
    rx.ConnectionError: "Redis is unreachable (refused, reset or closed connection)",
    rx.MaxConnectionsError: "the connection pool is exhausted",
}
_MAX_CLIENTS: type[BaseException] | None = getattr(rx, "MaxClientsReachedError", None)
if _MAX_CLIENTS is not None:  # redis-py >= 8.2
    CAUSES_BY_CLASS[_MAX_CLIENTS] = "Redis refused the connection: it serves its maxclients already"

#: Longest server message quoted in a cause (a reply can carry a whole script or value).
DETAIL_CHARS = 200


#: How a server words a command refused by the ACL inside a script (Redis, Valkey).
_SCRIPT_REFUSALS = ("user executing the script can't run", "ACL failure in script")


def refused_by_acl(exc: BaseException) -> bool:
    """The user may not run a command: NOPERM, or a script's command refused (a plain ERR reply:
    "The user executing the script can't run this command …" on Redis, "ACL failure in script: …"
    on Valkey)."""
    return error_code(exc) == "NOPERM" or _refused_in_script(exc)


def _refused_in_script(exc: BaseException) -> bool:
    text = str(exc)
    return any(words in text for words in _SCRIPT_REFUSALS)


def error_code(exc: BaseException) -> str:
    """The Redis error code of ``exc`` (``OOM``, ``WRONGTYPE`` …), or "".

    redis-py strips the code from the message of the classes it maps (``OutOfMemoryError``
    reads "command not allowed when used memory > 'maxmemory'") and keeps it in
    ``status_code``; a plain ``ResponseError`` keeps it in the message.
    """
    status = getattr(exc, "status_code", None)
    if isinstance(status, str) and status.isupper():
        return status
    return response_code(exc)


def describe_failure(exc: BaseException) -> str:
    """One line for an operator: the cause of ``exc`` in words, then the server's own text.

    Used by log lines and readiness so that, say, an OOM is reported as Redis being out of
    memory instead of as a credentials problem.
    """
    detail = f"{type(exc).__name__}: {exc}"
    if len(detail) > DETAIL_CHARS:
        detail = f"{detail[:DETAIL_CHARS]}... ({len(detail)} chars)"
    if isinstance(exc, BadTaskError):
        return f"bad task ({detail})"
    cause = CAUSES_BY_CODE.get(error_code(exc))
    if cause is None and is_tls_refusal(exc):
        cause = "the TLS handshake with Redis failed (wrong CA, an expired or untrusted certificate, or not a TLS port)"
    if cause is None and "maxmemory" in str(exc):
        cause = CAUSES_BY_CODE["OOM"]  # an OOM wrapped by a script or transaction error
    if cause is None:
        cause = next((CAUSES_BY_CLASS[c] for c in type(exc).__mro__ if c in CAUSES_BY_CLASS), None)
    if cause is None and isinstance(exc, OSError):
        cause = "Redis is unreachable (network error)"
    if cause is None:
        return detail if classify(exc) is ErrorKind.NOT_OURS else f"Redis refused the command ({detail})"
    return f"{cause} ({detail})"
