"""Validation of control-channel messages. Pure: no Redis, no I/O.

Anyone who can PUBLISH on the control channels can send anything, so a message is checked
completely before the worker acts on it: a JSON object no deeper than ``MAX_DEPTH``, a known
command, ``now``/``graceful`` real booleans (the string "false" is truthy and used to skip
the drain), ``reply_to``/``request_id`` short strings. Whatever is echoed in a log is cut to
``LOG_CHARS`` characters.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from plaita.errors import PlaitaError
from plaita.store.fleet import REPLY_PREFIX

#: Commands a worker understands (the same as ``plaita.ops.control.COMMANDS``, which cannot be
#: imported here: that module talks to Redis).
COMMANDS = ("stop", "pause", "resume", "status")
#: Longest message accepted, in bytes: real commands are under 300 bytes.
MAX_MESSAGE_BYTES = 64 * 1024
#: Deepest nesting accepted: real commands are flat; deep nesting only exists to attack the parser.
MAX_DEPTH = 8
#: Longest text echoed from a message into a log line.
LOG_CHARS = 64
#: Longest reply key / request id accepted.
MAX_KEY_CHARS = 512

_BOOL_FIELDS = ("now", "graceful")
_STR_FIELDS = ("reply_to", "request_id")


class BadControlMessage(PlaitaError):
    """A control message that is ignored; the text is safe to log (cut and repr'd)."""


@dataclass(frozen=True)
class ControlMessage:
    """A validated control command."""

    command: str
    now: bool = False
    graceful: bool | None = None
    reply_to: str | None = None
    request_id: str | None = None

    @property
    def immediate(self) -> bool:
        """True for a stop that skips the drain (``now`` true, or ``graceful`` explicitly false)."""
        return self.now or self.graceful is False

    def as_dict(self) -> dict[str, Any]:
        """The message as the worker's command handler receives it (only validated values)."""
        return {
            "command": self.command,
            "now": self.immediate,
            "graceful": not self.immediate,
            "reply_to": self.reply_to,
            "request_id": self.request_id,
        }


def loggable(value: Any, limit: int = LOG_CHARS) -> str:
    """``repr`` of ``value`` cut to ``limit`` characters, for log lines."""
    text = repr(value) if not isinstance(value, str) else repr(value[: limit + 1])
    return text if len(text) <= limit else f"{text[:limit]}... ({_size(value)})"


def _size(value: Any) -> str:
    return f"{len(value)} chars" if isinstance(value, str | bytes) else type(value).__name__


def _depth_ok(text: str, limit: int) -> bool:
    """True if the JSON text nests no deeper than ``limit`` (brackets outside strings counted).

    Checked on the text, before decoding, because decoding itself is what a deep message
    attacks (RecursionError)."""
    depth, in_string, escaped = 0, False, False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > limit:
                return False
        elif ch in "]}":
            depth -= 1
    return True


def _decode(data: bytes | str) -> dict[str, Any]:
    if len(data) > MAX_MESSAGE_BYTES:
        raise BadControlMessage(f"message is {len(data)} bytes, over the {MAX_MESSAGE_BYTES}-byte limit")
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
    except UnicodeDecodeError as exc:
        raise BadControlMessage(f"message is not UTF-8 ({exc.reason} at byte {exc.start})") from None
    if not _depth_ok(text, MAX_DEPTH):
        raise BadControlMessage(f"message is nested deeper than {MAX_DEPTH} levels")
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise BadControlMessage(f"message is not JSON ({loggable(str(exc))})") from None
    if not isinstance(value, dict):
        raise BadControlMessage(f"message is not a JSON object (got {type(value).__name__})")
    return value


def parse_control_message(data: bytes | str) -> ControlMessage:
    """The validated command in ``data``, or BadControlMessage saying (briefly) why not."""
    raw = _decode(data)
    name = raw.get("command")
    if not isinstance(name, str) or name not in COMMANDS:
        raise BadControlMessage(f"unknown control command {loggable(name)} (known: {', '.join(COMMANDS)})")
    for key in _BOOL_FIELDS:
        if key in raw and raw[key] is not None and not isinstance(raw[key], bool):
            raise BadControlMessage(f"{key!r} must be true or false (got {loggable(raw[key])})")
    for key in _STR_FIELDS:
        value = raw.get(key)
        if value is not None and not (isinstance(value, str) and 0 < len(value) <= MAX_KEY_CHARS):
            raise BadControlMessage(f"{key!r} must be a string of 1..{MAX_KEY_CHARS} chars (got {loggable(value)})")
    reply_to = raw.get("reply_to")
    if reply_to is not None and not reply_to.startswith(REPLY_PREFIX):
        # Otherwise any publisher could make every worker RPUSH into any key (the stream, say).
        raise BadControlMessage(f"'reply_to' must be a key starting with {REPLY_PREFIX!r}")
    return ControlMessage(
        command=name,
        now=raw.get("now") is True,
        graceful=raw.get("graceful") if isinstance(raw.get("graceful"), bool) else None,
        reply_to=raw.get("reply_to"),
        request_id=raw.get("request_id"),
    )
