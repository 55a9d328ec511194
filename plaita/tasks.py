"""Tasks: what a stream entry must hold, and what a handler receives. Pure: no Redis."""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from plaita.config import TASK_SCHEMA_VERSION
from plaita.errors import BadTaskError

logger = logging.getLogger(__name__)

#: Stream entry field holding the JSON body.
PAYLOAD_FIELD = "payload"
#: Stream entry field holding the body's schema version.
SCHEMA_FIELD = "schema_version"
#: One shared decoder: ``json.loads`` re-detects the encoding of bytes on every call.
_DECODER = json.JSONDecoder()
#: The fast path: a C decoder of strict RFC 8259 JSON, about 5x quicker than ``json`` on a task
#: body. It yields exactly what ``json`` yields for every document it accepts (big integers stay
#: ints); what it refuses (NaN, Infinity, lone surrogates, invalid UTF-8, ...) goes to ``json``,
#: so every entry gets the same body or the same reason as before.
_FAST_DECODER = msgspec.json.Decoder()
#: Task types a flow worker runs.
TASK_TYPES = frozenset({"start", "resume"})
#: A JSON ``\\uD800``..``\\uDFFF`` escape: the only way a lone surrogate gets into a decoded body
#: (the raw bytes were strict UTF-8). Only payloads containing one pay for the full check.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
#: Deepest JSON nesting a task body may have. A fixed limit, so the verdict on an entry never
#: depends on the recursion limit or on how deep the decoding thread's stack already is.
MAX_JSON_DEPTH = 128
#: The namespace of the default tenant's execution keys (``plaita:execution:<id>``, ...).
DEFAULT_NS = "plaita"
#: The tenant id that means the default tenant (as do a missing and an empty ``tenant_id``).
DEFAULT_TENANT = "default"
#: What a tenant id may be: it becomes part of every key of its executions, so no ``:`` (it would
#: read as another key layout), no ``{}`` (a hash tag: on Redis Cluster it would move the keys out
#: of their partition's slot), no whitespace or control bytes, and a bounded length.
TENANT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
#: Longest value echoed in a BadTaskError reason: reasons end up in logs and DLQ envelopes.
REASON_VALUE_CHARS = 80


class CancelFlag:
    """A cheap cancel flag with ``threading.Event``'s reading API (``is_set``, ``wait``).

    Most tasks are never cancelled and never wait, so the Event (several µs to build) is only
    created when a handler first waits on the flag.
    """

    __slots__ = ("_event", "_flag")
    _lock = threading.Lock()

    def __init__(self) -> None:
        self._flag = False
        self._event: threading.Event | None = None

    def set(self) -> None:
        with CancelFlag._lock:
            self._flag = True
            event = self._event
        if event is not None:
            event.set()

    def is_set(self) -> bool:
        return self._flag

    def wait(self, timeout: float | None = None) -> bool:
        """Block until set or ``timeout``; True if set (like ``Event.wait``)."""
        with CancelFlag._lock:
            if self._flag:
                return True
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        return event.wait(timeout)


@dataclass
class Task:
    """One delivery of a stream entry to a handler."""

    message_id: str
    body: dict[str, Any]
    delivery_count: int
    #: Set when the worker lost this task's lease (outage longer than the TTL, or a successor
    #: took over): the handler should stop and must not write results.
    cancelled: CancelFlag = field(default_factory=CancelFlag, repr=False)
    #: Fencing generation of the execution lease; writers refuse older generations.
    fencing_token: int = 0
    #: Where this task's execution keys live (a ``plaita.store.keyspace.Keyspace``, set by the
    #: worker): pass it to ``fenced_set(..., keyspace=task.keyspace)``; None = the untagged keys
    #: of an unpartitioned queue.
    keyspace: Any = field(default=None, repr=False)
    #: Set by the worker on a task that killed its worker process ``--max-crashes`` times (the DLQ
    #: reason): a handler that knows it (the flow runner) ends the execution ``error`` with it
    #: instead of running it, and raises ``BadTaskError``.
    crash_verdict: str | None = field(default=None, repr=False)

    @property
    def tenant_id(self) -> str:
        """The body's tenant id, "" for the default tenant (``validate_body`` checked it)."""
        value = self.body.get("tenant_id")
        return "" if not isinstance(value, str) or value == DEFAULT_TENANT else value

    @property
    def execution_id(self) -> str:
        """The body's ``execution_id``, else the message id."""
        value = self.body.get("execution_id")
        return value if isinstance(value, str) and value else self.message_id


def short_repr(value: Any, limit: int = REASON_VALUE_CHARS) -> str:
    """``repr(value)`` cut to ``limit`` characters; never raises (a hostile value may be deep)."""
    try:
        text = repr(value)
    except RecursionError:
        return f"<{type(value).__name__} nested too deep>"
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"


def tenant_ns(tenant_id: Any) -> str:
    """The key namespace of a tenant: ``plaita`` for None, "" or "default", else ``plaita:<id>``.
    ValueError for anything that is not a valid tenant id (``TENANT_ID``)."""
    if tenant_id is None or tenant_id == "" or tenant_id == DEFAULT_TENANT:
        return DEFAULT_NS
    if not isinstance(tenant_id, str) or TENANT_ID.fullmatch(tenant_id) is None:
        raise ValueError(
            f"invalid tenant_id {short_repr(tenant_id)}: 1 to 64 of A-Z a-z 0-9 _ . - (starting with a letter or digit)"
        )
    return f"{DEFAULT_NS}:{tenant_id}"


def validate_body(body: Any, *, named: bool = False) -> dict[str, Any]:
    """Return ``body`` if it is a runnable task body, else raise BadTaskError with the reason.

    ``named``: the worker runs named tasks (``--tasks``), so any non-empty string ``type`` is a
    task's name (or ``task``, naming it in ``task``); whether this worker knows it is the named-task
    runner's decision. A ``start`` or ``resume`` body is checked as for every worker either way.
    """
    if not isinstance(body, dict):
        raise BadTaskError(f"payload is not a JSON object (got {type(body).__name__})")
    task_type = body.get("type")
    if task_type is None:
        raise BadTaskError("payload has no 'type' field (expected 'start' or 'resume')")
    # A str check first: an unhashable type (a list, an object) would make ``in`` raise TypeError.
    if not isinstance(task_type, str) or not (task_type in TASK_TYPES or (named and task_type)):
        raise BadTaskError(f"unknown task type {short_repr(task_type)} (expected 'start' or 'resume')")
    execution_id = body.get("execution_id")
    if execution_id is not None and not (isinstance(execution_id, str) and execution_id):
        # Leases are keyed by it, in Python and in Lua alike: only a string is unambiguous.
        raise BadTaskError(f"'execution_id' must be a non-empty string (got {short_repr(execution_id)})")
    if task_type == "resume" and not execution_id:
        raise BadTaskError("resume task has no 'execution_id'")
    if "tenant_id" in body:
        try:
            tenant_ns(body["tenant_id"])
        except ValueError as exc:  # its keys would be ambiguous or escape their slot: refused
            raise BadTaskError(str(exc)) from None
    return body


def _text(value: bytes | str) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else value


def _schema_version(fields: Mapping[str, bytes | str], message_id: str) -> int:
    raw = fields.get(SCHEMA_FIELD)
    if raw is None or raw == b"1":
        return 1
    try:
        return int(_text(raw))
    except (ValueError, UnicodeDecodeError):
        # A garbled version is read as v1, with a warning: entries written before versions existed
        # must keep running, and v1 is what they are.
        logger.warning("task %s has an unreadable schema_version %r; reading it as v1", message_id, raw)
        return 1


def parse_entry(
    message_id: str,
    fields: Mapping[str, bytes | str],
    delivery_count: int,
    *,
    max_payload_bytes: int,
    problems: Sequence[str] = (),
    named: bool = False,
) -> Task:
    """Turn a raw stream entry into a Task, or raise BadTaskError saying why it is not one.

    Nothing but BadTaskError escapes, whatever the entry holds: one hostile entry must end in
    the DLQ, never stop the worker. ``problems`` are the findings of ``decode_fields``; any
    of them makes the entry bad. ``named``: as in ``validate_body``.
    """
    if problems:
        raise BadTaskError(f"malformed entry: {'; '.join(problems)}")
    raw = fields.get(PAYLOAD_FIELD)
    if raw is None:
        raise BadTaskError(f"entry has no '{PAYLOAD_FIELD}' field")
    size = len(raw) if isinstance(raw, bytes) else len(raw.encode("utf-8", "surrogatepass"))
    if size > max_payload_bytes:
        raise BadTaskError(f"payload is {size} bytes, over the {max_payload_bytes}-byte limit")
    version = _schema_version(fields, message_id)
    if version > TASK_SCHEMA_VERSION:
        raise BadTaskError(f"unsupported schema_version={version} (this build understands <= {TASK_SCHEMA_VERSION})")
    body = _decode_payload(raw)
    return Task(message_id, validate_body(body, named=named), delivery_count)


def _decode_payload(raw: bytes | str) -> Any:
    """The JSON value of a payload; BadTaskError for invalid, too deep or unencodable text."""
    if isinstance(raw, bytes):
        try:
            body = _FAST_DECODER.decode(raw)
        except Exception:  # whatever it refuses, ``json`` decides (and words the reason)
            return _decode_payload_slowly(raw)
        # It refuses lone surrogates and invalid UTF-8, so only the depth is left to check; a
        # payload this short cannot hold that many brackets (most skip the count as well).
        if (
            len(raw) > MAX_JSON_DEPTH
            and raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH
            and _depth_over(body, MAX_JSON_DEPTH)
        ):
            raise BadTaskError(f"payload is nested too deep (more than {MAX_JSON_DEPTH} levels)")
        return body
    return _decode_payload_slowly(raw)


def _decode_payload_slowly(raw: bytes | str) -> Any:
    """``_decode_payload`` with ``json``: NaN and Infinity pass, every refusal has its reason."""
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        body = _DECODER.decode(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadTaskError(f"payload is not valid JSON: {exc}") from None
    except RecursionError:
        raise BadTaskError(f"payload is nested too deep (more than {MAX_JSON_DEPTH} levels)") from None
    # Fewer brackets than the limit cannot nest deeper than it: most payloads skip the walk.
    if text.count("[") + text.count("{") > MAX_JSON_DEPTH and _depth_over(body, MAX_JSON_DEPTH):
        raise BadTaskError(f"payload is nested too deep (more than {MAX_JSON_DEPTH} levels)")
    if _SURROGATE_ESCAPE.search(text) or not isinstance(raw, bytes):
        _check_encodable(body)
    return body


def _depth_over(value: Any, limit: int) -> bool:
    """True if ``value`` nests lists/objects deeper than ``limit``; iterative (no recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


def _check_encodable(body: Any) -> None:
    """BadTaskError if ``body`` holds a lone surrogate: it cannot be sent to Redis or Lua as UTF-8,
    so every later write of it (lease, DLQ, results) would fail, again on every retry."""
    try:
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = exc.object[exc.start : exc.end]
        raise BadTaskError(f"payload holds a lone UTF-16 surrogate {bad!r}, which is not valid Unicode") from None
    except RecursionError:
        raise BadTaskError("payload is nested too deep to encode") from None


def decode_fields(flat: Sequence[bytes | str]) -> tuple[dict[str, bytes], list[str]]:
    """A raw flat field list (``[name, value, name, value, ...]``) as a dict, plus its problems.

    Names are decoded as UTF-8. A name that is not UTF-8 is kept losslessly with the
    ``surrogateescape`` error handler (``field_name_bytes`` gives back the exact bytes), so
    the entry can still be parsed, dead-lettered and reported instead of failing the whole
    read. Values stay bytes. Problems (non-UTF-8 name, duplicated name, a name without value)
    make ``parse_entry`` reject the entry; for a duplicated name the last value wins, as in
    redis-py. Pure and total: never raises for any list of bytes or str.
    """
    if len(flat) == 4 and flat[0] == b"payload" and flat[2] == b"schema_version":
        payload, version = flat[1], flat[3]  # what every producer writes: skip the general walk
        if isinstance(payload, bytes) and isinstance(version, bytes):
            return {PAYLOAD_FIELD: payload, SCHEMA_FIELD: version}, []
    fields: dict[str, bytes] = {}
    problems: list[str] = []
    if len(flat) % 2:
        problems.append(f"field {short_repr(flat[-1])} has no value")
    for i in range(0, len(flat) - 1, 2):
        name_raw, value = flat[i], flat[i + 1]
        if isinstance(name_raw, bytes):
            try:
                name = name_raw.decode("utf-8")
            except UnicodeDecodeError:
                name = name_raw.decode("utf-8", "surrogateescape")
                problems.append(f"field name {short_repr(name_raw)} is not UTF-8")
        else:
            name = name_raw
        if name in fields:
            problems.append(f"field {short_repr(name)} appears more than once")
        fields[name] = value if isinstance(value, bytes) else value.encode("utf-8", "surrogatepass")
    return fields, problems


def field_name_bytes(name: str) -> bytes:
    """The exact bytes of a field name decoded by ``decode_fields`` (inverse of its decoding)."""
    return name.encode("utf-8", "surrogateescape")


def encode_body(body: dict[str, Any]) -> str:
    """The ``payload`` field for ``body`` (UTF-8 JSON, non-ASCII kept as is)."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"))
