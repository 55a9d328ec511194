"""``plaita.tasks`` on hostile entries: nothing but BadTaskError ever escapes. Pure: no Redis."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from plaita.errors import BadTaskError
from plaita.tasks import MAX_JSON_DEPTH, decode_fields, field_name_bytes, parse_entry

LIMIT = 1024 * 1024
GOOD = b'{"type":"start","flow_id":"f"}'


def parse(fields: dict[str, Any], **kw: Any) -> Any:
    return parse_entry("1-0", fields, 1, max_payload_bytes=LIMIT, **kw)


def deep(levels: int) -> bytes:
    return b'{"type":"start","x":' + b"[" * levels + b"]" * levels + b"}"


class TestParseEntryHostile:
    """Each reproduction of issue 10 that used to escape parse_entry is now a BadTaskError."""

    def test_deep_json_is_bad_task_not_recursion_error(self) -> None:
        """200000 nested arrays (400 KB, under the limit) used to raise RecursionError."""
        with pytest.raises(BadTaskError, match="nested too deep"):
            parse({"payload": deep(200_000)})

    def test_depth_limit_is_exact_and_independent_of_the_recursion_limit(self) -> None:
        """128 levels parse, 129 do not, even when a raised recursion limit would let the decoder go deeper
        (Hypothesis raises it, and a thread's stack depth varies: the verdict must not)."""
        assert parse({"payload": deep(MAX_JSON_DEPTH - 1)}).body["type"] == "start"
        old = sys.getrecursionlimit()
        sys.setrecursionlimit(20_000)
        try:
            with pytest.raises(BadTaskError, match="nested too deep"):
                parse({"payload": deep(MAX_JSON_DEPTH)})
            with pytest.raises(BadTaskError, match="nested too deep"):
                parse({"payload": deep(3_000)})
        finally:
            sys.setrecursionlimit(old)

    def test_moderately_nested_json_still_parses(self) -> None:
        """Nesting the decoder can handle is a valid body: the fix only catches the overflow."""
        task = parse({"payload": deep(100)})
        assert task.body["type"] == "start"

    @pytest.mark.parametrize(
        "payload",
        [
            pytest.param(rb'{"type":"start","execution_id":"\ud800"}', id="lone-high-in-execution-id"),
            pytest.param(rb'{"type":"start","params":{"x":"a\udfffb"}}', id="lone-low-in-nested-value"),
            pytest.param(rb'{"type":"start","\uDBFF":1}', id="lone-surrogate-in-key-upper-hex"),
        ],
    )
    def test_lone_surrogate_is_bad_task(self, payload: bytes) -> None:
        """A lone surrogate cannot be sent to Redis as UTF-8: rejected here, before any lease or DLQ write."""
        with pytest.raises(BadTaskError, match="surrogate"):
            parse({"payload": payload})

    def test_surrogate_pair_escape_is_a_valid_character(self) -> None:
        """An escaped pair is a real character (U+1F600), not a lone surrogate."""
        task = parse({"payload": rb'{"type":"start","execution_id":"\ud83d\ude00"}'})
        assert task.execution_id == "\U0001f600"

    def test_escaped_backslash_before_u_d800_is_not_a_surrogate(self) -> None:
        """``\\\\ud800`` is a backslash and the text ud800: the cheap pre-check may fire, the verdict must not."""
        task = parse({"payload": rb'{"type":"start","execution_id":"\\ud800"}'})
        assert task.execution_id == "\\ud800"

    def test_str_payload_with_lone_surrogate_is_bad_task(self) -> None:
        """A str payload holding a raw lone surrogate: BadTaskError, not UnicodeEncodeError."""
        with pytest.raises(BadTaskError):
            parse({"payload": '{"type":"start","execution_id":"\ud800"}'})

    @pytest.mark.parametrize("task_type", [[], {}, [1, 2], {"a": 1}])
    def test_unhashable_type_is_bad_task(self, task_type: Any) -> None:
        """``"type": []`` used to raise TypeError from the set membership test."""
        with pytest.raises(BadTaskError, match="unknown task type"):
            parse({"payload": json.dumps({"type": task_type}).encode()})

    def test_reason_for_a_huge_value_is_short(self) -> None:
        """A 100 KB execution id is not echoed whole into the reason (it goes to logs and the DLQ)."""
        with pytest.raises(BadTaskError) as info:
            parse({"payload": json.dumps({"type": "start", "execution_id": [1] * 50_000}).encode()})
        assert len(info.value.reason) < 300

    def test_problems_make_the_entry_bad(self) -> None:
        """Problems found by decode_fields reject an otherwise valid entry, naming them."""
        with pytest.raises(BadTaskError, match="is not UTF-8"):
            parse({"payload": GOOD}, problems=["field name b'\\xff' is not UTF-8"])


class TestDecodeFields:
    """decode_fields: a raw flat list becomes fields plus problems, losslessly, never raising."""

    def test_non_utf8_name_is_kept_losslessly_and_reported(self) -> None:
        """Reproduction 1: a field named b'\\xff\\xfe' used to raise UnicodeDecodeError in the read."""
        fields, problems = decode_fields([b"\xff\xfe", b"x", b"payload", GOOD])
        assert fields["payload"] == GOOD
        [name] = [k for k in fields if k != "payload"]
        assert field_name_bytes(name) == b"\xff\xfe"
        assert problems == ["field name b'\\xff\\xfe' is not UTF-8"]
        with pytest.raises(BadTaskError, match="not UTF-8"):
            parse(fields, problems=problems)

    def test_clean_entry_has_no_problems(self) -> None:
        fields, problems = decode_fields([b"payload", GOOD, b"schema_version", b"1"])
        assert fields == {"payload": GOOD, "schema_version": b"1"}
        assert problems == []
        assert parse(fields, problems=problems).body["flow_id"] == "f"

    def test_duplicate_and_dangling_names_are_problems(self) -> None:
        fields, problems = decode_fields([b"payload", b"a", b"payload", GOOD, b"tail"])
        assert fields == {"payload": GOOD}  # last value wins, as in redis-py
        assert any("appears more than once" in p for p in problems)
        assert any("has no value" in p for p in problems)

    @settings(max_examples=300, deadline=None, database=None)
    @given(st.lists(st.binary(max_size=12), max_size=12))
    def test_total_and_lossless_for_any_bytes(self, flat: list[bytes]) -> None:
        """Any flat list: no exception, and every name maps back to its exact bytes."""
        fields, problems = decode_fields(flat)
        names = {field_name_bytes(k) for k in fields}
        assert names == set(flat[0 : len(flat) - 1 : 2])
        assert isinstance(problems, list)


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4),
    max_leaves=20,
)


class TestParseEntryProperty:
    """For any entry, parse_entry returns a Task or raises BadTaskError: nothing else."""

    @settings(max_examples=400, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
    @given(
        st.dictionaries(
            st.sampled_from(["payload", "schema_version", "x"]) | st.text(max_size=4),
            st.binary(max_size=64)
            | JSONISH.map(lambda v: json.dumps(v).encode())
            | st.fixed_dictionaries(
                {"type": st.sampled_from(["start", "resume"]) | JSONISH}, optional={"execution_id": JSONISH}
            ).map(lambda v: json.dumps(v).encode()),
            max_size=4,
        )
    )
    def test_only_bad_task_error_escapes(self, fields: dict[str, bytes]) -> None:
        try:
            task = parse(fields)
        except BadTaskError as exc:
            assert exc.reason
        else:
            assert task.body["type"] in ("start", "resume")
            json.dumps(task.body, ensure_ascii=False).encode("utf-8")  # every accepted body is sendable
