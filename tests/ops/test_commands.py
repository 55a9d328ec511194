"""Control-message validation (``plaita.ops.commands``). Pure: no Redis."""

from __future__ import annotations

import json

import pytest

from plaita.ops.commands import LOG_CHARS, BadControlMessage, loggable, parse_control_message
from plaita.store.fleet import REPLY_PREFIX


def test_valid_stop_with_reply() -> None:
    key = f"{REPLY_PREFIX}k"
    m = parse_control_message(json.dumps({"command": "stop", "now": True, "reply_to": key, "request_id": "r"}))
    assert (m.command, m.immediate, m.reply_to, m.request_id) == ("stop", True, key, "r")
    assert m.as_dict()["now"] is True


@pytest.mark.parametrize("key", ["plaita:flow:queue", "k", "other:control:reply:x"])
def test_reply_to_must_be_a_reply_key(key: str) -> None:
    """Otherwise any publisher could make every worker RPUSH into any key (the stream, say)."""
    with pytest.raises(BadControlMessage, match="reply_to"):
        parse_control_message(json.dumps({"command": "status", "reply_to": key}))


def test_graceful_false_means_immediate() -> None:
    assert parse_control_message(b'{"command":"stop","graceful":false}').immediate is True
    assert parse_control_message(b'{"command":"stop"}').immediate is False


@pytest.mark.parametrize("now", ['"false"', '"true"', "1", "0", '"no"', "[]"])
def test_now_must_be_a_real_boolean(now: str) -> None:
    """Reproduction 10: ``"now":"false"`` is truthy and skipped the drain."""
    with pytest.raises(BadControlMessage, match="'now' must be true or false"):
        parse_control_message(f'{{"command":"stop","now":{now}}}')


def test_nested_json_is_a_bad_message_not_recursion_error() -> None:
    """Reproduction 10: nested JSON was reported as 'control channel unavailable (RecursionError)'."""
    with pytest.raises(BadControlMessage, match="nested deeper"):
        parse_control_message('{"command":"stop","x":' + "[" * 30_000 + "]" * 30_000 + "}")


def test_brackets_inside_strings_do_not_count_as_nesting() -> None:
    m = parse_control_message(json.dumps({"command": "status", "request_id": "[[[[[[[[[[[[{{{{{{{{" + '\\"['}))
    assert m.command == "status"


def test_huge_command_name_is_cut_in_the_reason() -> None:
    """Reproduction 10: a 2 MB command name was logged whole."""
    with pytest.raises(BadControlMessage) as info:
        parse_control_message(json.dumps({"command": "x" * 30_000}))
    assert len(str(info.value)) < 200


def test_oversized_message_is_refused_before_decoding() -> None:
    with pytest.raises(BadControlMessage, match="over the"):
        parse_control_message(json.dumps({"command": "x" * 2_000_000}))


@pytest.mark.parametrize(
    "raw",
    [b"\xff\xfe", b"not json", b"[1]", b'"stop"', b'{"command":1}', b'{"command":"stop","reply_to":5}'],
)
def test_malformed_messages_are_bad_messages(raw: bytes) -> None:
    with pytest.raises(BadControlMessage):
        parse_control_message(raw)


def test_loggable_cuts() -> None:
    assert len(loggable("y" * 10_000)) < LOG_CHARS + 30
