"""Tasks: what a stream entry must hold, and what a handler receives. Pure: no Redis."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from plaita.config import TASK_SCHEMA_VERSION
from plaita.errors import BadTaskError

logger = logging.getLogger(__name__)

#: Stream entry field holding the JSON body.
PAYLOAD_FIELD = "payload"
#: Stream entry field holding the body's schema version.
SCHEMA_FIELD = "schema_version"
#: Task types a flow worker runs.
TASK_TYPES = frozenset({"start", "resume"})


@dataclass
class Task:
    """One delivery of a stream entry to a handler."""

    message_id: str
    body: dict[str, Any]
    delivery_count: int
    #: Set when the worker lost this task's lease (outage longer than the TTL, or a successor
    #: took over): the handler should stop and must not write results.
    cancelled: threading.Event = field(default_factory=threading.Event, repr=False)
    #: Fencing generation of the execution lease; writers refuse older generations.
    fencing_token: int = 0

    @property
    def execution_id(self) -> str:
        """The body's ``execution_id``, else the message id."""
        value = self.body.get("execution_id")
        return str(value) if value else self.message_id


def validate_body(body: Any) -> dict[str, Any]:
    """Return ``body`` if it is a runnable task body, else raise BadTaskError with the reason."""
    if not isinstance(body, dict):
        raise BadTaskError(f"payload is not a JSON object (got {type(body).__name__})")
    task_type = body.get("type")
    if task_type is None:
        raise BadTaskError("payload has no 'type' field (expected 'start' or 'resume')")
    if task_type not in TASK_TYPES:
        raise BadTaskError(f"unknown task type {task_type!r} (expected 'start' or 'resume')")
    if task_type == "resume" and not body.get("execution_id"):
        raise BadTaskError("resume task has no 'execution_id'")
    return body


def _text(value: bytes | str) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else value


def _schema_version(fields: Mapping[str, bytes | str], message_id: str) -> int:
    raw = fields.get(SCHEMA_FIELD)
    if raw is None:
        return 1
    try:
        return int(_text(raw))
    except (ValueError, UnicodeDecodeError):
        # Compatible with the original worker: a garbled version is read as v1, with a warning.
        logger.warning("task %s has an unreadable schema_version %r; reading it as v1", message_id, raw)
        return 1


def parse_entry(
    message_id: str,
    fields: Mapping[str, bytes | str],
    delivery_count: int,
    *,
    max_payload_bytes: int,
) -> Task:
    """Turn a raw stream entry into a Task, or raise BadTaskError saying why it is not one."""
    raw = fields.get(PAYLOAD_FIELD)
    if raw is None:
        raise BadTaskError(f"entry has no '{PAYLOAD_FIELD}' field")
    size = len(raw) if isinstance(raw, bytes) else len(raw.encode("utf-8"))
    if size > max_payload_bytes:
        raise BadTaskError(f"payload is {size} bytes, over the {max_payload_bytes}-byte limit")
    version = _schema_version(fields, message_id)
    if version > TASK_SCHEMA_VERSION:
        raise BadTaskError(f"unsupported schema_version={version} (this build understands <= {TASK_SCHEMA_VERSION})")
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadTaskError(f"payload is not valid JSON: {exc}") from None
    return Task(message_id, validate_body(body), delivery_count)


def encode_body(body: dict[str, Any]) -> str:
    """The ``payload`` field for ``body`` (UTF-8 JSON, non-ASCII kept as is)."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"))


def raw_payload_text(fields: Mapping[str, bytes | str]) -> str | None:
    """The payload field as text (lossy for undecodable bytes), for DLQ envelopes."""
    value = fields.get(PAYLOAD_FIELD)
    if value is not None:
        return value.decode("utf-8", "replace") if isinstance(value, bytes) else value
    return None
