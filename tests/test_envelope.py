"""``plaita.envelope``: a dead letter keeps its source entry exactly. Pure: no Redis."""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from plaita.envelope import TRUNCATED_HEAD_BYTES, build_envelope, decode_value, encode_value, original_fields
from plaita.tasks import decode_fields


def envelope(fields: Any, body: Any = None, max_value_bytes: int = 1024) -> dict[str, Any]:
    text = build_envelope(
        reason="r",
        source_stream="s",
        source_id="1-0",
        delivery_count=2,
        dead_lettered_at=1.5,
        fields=fields,
        body=body,
        max_value_bytes=max_value_bytes,
    )
    text.encode("utf-8")  # must always be a valid Redis argument
    return dict(json.loads(text))


def test_compatible_keys_are_kept() -> None:
    """The original envelope keys stay, so ``plaita dlq`` and older readers still work."""
    env = envelope([(b"payload", b'{"type":"start"}')], body={"type": "start"})
    assert {k: env[k] for k in ("reason", "source_stream", "source_id", "delivery_count", "dead_lettered_at")} == {
        "reason": "r",
        "source_stream": "s",
        "source_id": "1-0",
        "delivery_count": 2,
        "dead_lettered_at": 1.5,
    }
    assert env["payload"] == {"type": "start"}


def test_entry_without_payload_keeps_its_other_fields() -> None:
    """Reproduction 10: an entry without payload used to lose every other field in the DLQ."""
    env = envelope([(b"body", b"{}"), (b"schema_version", b"1")])
    assert env["payload"] is None
    assert env["fields"] == [["body", "{}"], ["schema_version", "1"]]


def test_binary_payload_is_base64_not_replacement_characters() -> None:
    """Reproduction 10: a binary payload used to be stored lossily with U+FFFD."""
    raw = b"\xff\x00\xfe binary"
    env = envelope([(b"payload", raw)])
    assert env["payload"] == {"base64": base64.b64encode(raw).decode()}
    assert "\ufffd" not in json.dumps(env, ensure_ascii=False)
    assert original_fields(env) == [(b"payload", raw)]


def test_non_utf8_field_name_from_decode_fields_is_kept_exactly() -> None:
    """A name decoded losslessly by decode_fields comes back as its exact bytes."""
    fields, _problems = decode_fields([b"\xff\xfe", b"x", b"payload", b"{}"])
    env = envelope(fields)
    assert original_fields(env) == [(b"\xff\xfe", b"x"), (b"payload", b"{}")]


def test_duplicates_and_order_are_kept_from_pairs() -> None:
    pairs = [(b"payload", b"a"), (b"x", b""), (b"payload", b"b")]
    assert original_fields(envelope(pairs)) == pairs


def test_huge_payload_is_truncated_with_size_and_hash() -> None:
    """Reproduction 10: a 5 MB payload used to be stored whole."""
    raw = b"x" * (5 * 1024 * 1024)
    env = envelope([(b"payload", raw)], max_value_bytes=64 * 1024)
    assert len(json.dumps(env)) < 4096
    marker = env["payload"]
    assert marker["truncated"] is True
    assert marker["size"] == len(raw)
    assert marker["sha256"] == hashlib.sha256(raw).hexdigest()
    assert marker["head"] == "x" * TRUNCATED_HEAD_BYTES
    assert env["fields"][0][1] == marker


def test_truncated_head_of_multibyte_text_stays_text() -> None:
    """A head cut inside a multi-byte character drops that character instead of going base64."""
    marker = encode_value("é" * 1000, max_value_bytes=10)
    assert isinstance(marker, dict)
    assert marker["head_encoding"] == "utf-8"
    assert marker["head"] == "é" * (TRUNCATED_HEAD_BYTES // 2)


def test_body_with_lone_surrogate_is_still_encodable() -> None:
    """A body a handler rejected, holding a lone surrogate, used to make the settler fail on every retry."""
    env = envelope([(b"payload", rb'{"e":"\ud800"}')], body={"e": "\ud800"})
    assert env["payload"] == {"e": "\ud800"}


def test_truncated_value_cannot_be_replayed() -> None:
    marker = encode_value(b"y" * 100, max_value_bytes=10)
    try:
        decode_value(marker)
    except ValueError as exc:
        assert "truncated" in str(exc)
    else:
        raise AssertionError("a truncated value decoded")


@settings(max_examples=300, deadline=None, database=None)
@given(st.lists(st.tuples(st.binary(max_size=20), st.binary(max_size=40)), max_size=6))
def test_any_entry_round_trips_exactly(pairs: list[tuple[bytes, bytes]]) -> None:
    """For any field pairs under the limit, the envelope gives back the exact bytes."""
    assert original_fields(envelope(pairs)) == pairs
