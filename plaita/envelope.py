"""The DLQ envelope: what a dead letter keeps of its source entry. Pure: no Redis.

The envelope is one JSON object (the DLQ entry's ``payload`` field), readable by
existing DLQ readers (``reason``, ``source_stream``, ``source_id``, ``delivery_count``,
``dead_lettered_at``, ``payload``) plus ``fields``: the source entry exactly, every field in
order, duplicates included, as ``[name, value]`` pairs. An operator must be able to see and
replay what was sent, so nothing is decoded lossily:

* a name or value that is valid UTF-8 is a JSON string;
* any other bytes are ``{"base64": "..."}``;
* a value longer than ``max_value_bytes`` is ``{"truncated": true, "size": N, "sha256": hex,
  "head": text-or-base64-prefix, "head_encoding": "utf-8"|"base64"}`` so a 5 MB payload does not
  fill the DLQ, while its size and hash still identify it.

``payload`` is the parsed body when there is one and it fits, else the payload text when it is
UTF-8 and fits, else the same encoded form as in ``fields`` (None when there was no payload).
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

from plaita.tasks import PAYLOAD_FIELD, field_name_bytes

#: Longest field value kept whole in an envelope; longer ones keep a head, size and sha256.
DEFAULT_MAX_VALUE_BYTES = 64 * 1024
#: Bytes of a truncated value kept as its head.
TRUNCATED_HEAD_BYTES = 256

Encoded = str | dict[str, Any]


def _as_bytes(value: bytes | str) -> bytes:
    """``value`` as bytes. A str name decoded by ``decode_fields`` gets its exact bytes back
    (surrogateescape); any other lone surrogate is kept as is (surrogatepass), so that no
    input can make the builder raise."""
    if isinstance(value, bytes):
        return value
    try:
        return field_name_bytes(value)
    except UnicodeEncodeError:
        return value.encode("utf-8", "surrogatepass")


def encode_value(raw: bytes | str, max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES) -> Encoded:
    """``raw`` as JSON-safe data: text if UTF-8, else base64; truncated with size and hash if long."""
    data = _as_bytes(raw)
    if len(data) > max_value_bytes:
        head_text = _utf8_head(data[:TRUNCATED_HEAD_BYTES])
        return {
            "truncated": True,
            "size": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
            "head": head_text if head_text is not None else _b64(data[:TRUNCATED_HEAD_BYTES]),
            "head_encoding": "utf-8" if head_text is not None else "base64",
        }
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": _b64(data)}


def _utf8_head(head: bytes) -> str | None:
    """``head`` as text, allowing only a multi-byte character cut at its end; None if not UTF-8."""
    for cut in range(4):  # a UTF-8 character is at most 4 bytes: at most 3 of them are cut off
        try:
            return head[: len(head) - cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
    return None


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def decode_value(encoded: Encoded) -> bytes:
    """The original bytes of a value encoded by ``encode_value``.

    ValueError for a truncated value (its bytes are gone; only size and hash remain) or an
    unknown form, so a replay never sends a silently different entry.
    """
    if isinstance(encoded, str):
        return encoded.encode("utf-8")
    if isinstance(encoded, dict) and isinstance(encoded.get("base64"), str):
        return base64.b64decode(encoded["base64"], validate=True)
    if isinstance(encoded, dict) and encoded.get("truncated"):
        size, digest = encoded.get("size"), encoded.get("sha256")
        raise ValueError(f"value was truncated in the DLQ ({size} bytes, sha256 {digest})")
    raise ValueError(f"not an encoded DLQ value: {type(encoded).__name__}")


def _pairs(fields: Mapping[Any, Any] | Iterable[tuple[Any, Any]] | None) -> list[tuple[bytes | str, bytes | str]]:
    if fields is None:
        return []
    items = fields.items() if isinstance(fields, Mapping) else fields
    return [(k, v) for k, v in items]


def _payload_of(pairs: list[tuple[bytes | str, bytes | str]], body: Any, max_value_bytes: int) -> Any:
    raw = next((v for k, v in reversed(pairs) if _as_bytes(k) == PAYLOAD_FIELD.encode()), None)
    if raw is None:
        return body
    fits = len(_as_bytes(raw)) <= max_value_bytes
    if body is not None and fits:
        return body
    return encode_value(raw, max_value_bytes)


def build_envelope(
    *,
    reason: str,
    source_stream: str,
    source_id: str,
    delivery_count: int,
    dead_lettered_at: float,
    fields: Mapping[Any, Any] | Iterable[tuple[Any, Any]] | None,
    body: Any = None,
    max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
) -> str:
    """The envelope JSON for one dead letter; always encodable as UTF-8 (safe as a Redis argument).

    ``fields`` is the source entry: the raw ``(name, value)`` pairs in order (best, keeps
    duplicates) or a mapping; None when the entry was deleted. ``body`` is the parsed body
    when the entry parsed (a handler rejected it or it ran out of deliveries).
    """
    pairs = _pairs(fields)
    envelope = {
        "reason": reason,
        "source_stream": source_stream,
        "source_id": source_id,
        "delivery_count": delivery_count,
        "dead_lettered_at": dead_lettered_at,
        "payload": _payload_of(pairs, body, max_value_bytes),
        "fields": [[encode_value(k, max_value_bytes), encode_value(v, max_value_bytes)] for k, v in pairs],
    }
    try:
        text = json.dumps(envelope, ensure_ascii=False)
        text.encode("utf-8")
    except UnicodeEncodeError:
        # A body with a lone surrogate (a handler's own body): ASCII escapes are always encodable.
        text = json.dumps(envelope, ensure_ascii=True)
    except (RecursionError, TypeError, ValueError):
        # A body json cannot write back (too deep, not JSON data): the raw fields still have it.
        envelope["payload"] = _payload_of(pairs, None, max_value_bytes)
        text = json.dumps(envelope, ensure_ascii=True)
    return text


def original_fields(envelope: Mapping[str, Any]) -> list[tuple[bytes, bytes]]:
    """The source entry's exact ``(name, value)`` byte pairs from an envelope (for a replay).

    ValueError when the envelope has no ``fields`` (written by an older worker) or a value was
    truncated.
    """
    raw = envelope.get("fields")
    if not isinstance(raw, list):
        raise ValueError("envelope has no 'fields' (written by an older worker)")
    out = []
    for pair in raw:
        if not (isinstance(pair, list) and len(pair) == 2):
            raise ValueError(f"malformed field pair in envelope: {pair!r:.80}")
        out.append((decode_value(pair[0]), decode_value(pair[1])))
    return out
