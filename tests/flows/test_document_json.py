"""``dumps_document``: the fast encoder of execution documents writes exactly the documents
``dumps`` (strict ``json``) accepts, refuses the others as ``dumps`` does, and its text reads back
to the same value. Pure: no Redis."""

from __future__ import annotations

import dataclasses
import datetime
import enum
import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plaita.flows.model.validate import dumps, dumps_document


class Colour(enum.Enum):
    RED = "red"


class Level(enum.IntEnum):
    HIGH = 3


@dataclasses.dataclass
class Point:
    x: int


def outcome(fn: Any, value: Any) -> tuple[str, Any]:
    try:
        return "ok", json.loads(fn(value))
    except Exception as exc:  # the kind of refusal is what is compared
        return "raised", type(exc)


ODD = [
    {"state": {"x": math.nan}},
    {"state": {"x": math.inf}},
    {"state": [-math.inf]},
    {"state": {1, 2}},
    {"state": frozenset()},
    {"state": datetime.datetime(2026, 12, 7, tzinfo=datetime.UTC)},
    {"state": datetime.date(2026, 12, 7)},
    {"state": b"bytes"},
    {"state": bytearray(b"x")},
    {"state": Point(1)},
    {"state": Colour.RED},
    {"state": Level.HIGH},
    {"state": (1, "two", None)},
    {"state": {1: "int key", 2.5: "float key", False: "bool key", None: "none key"}},
    {"state": "lone \ud800 surrogate"},
    {"state": 'é \u2028 \x00 \x7f "quoted" \\'},
    {"state": 2**70, "small": -(2**70), "f": 1e100, "g": 1e-7, "z": -0.0},
    {"state": object()},
]


@pytest.mark.parametrize("doc", ODD, ids=range(len(ODD)))
def test_a_document_is_accepted_or_refused_exactly_as_dumps_does(doc: dict[str, Any]) -> None:
    assert outcome(dumps_document, doc) == outcome(dumps, doc)


def test_a_self_referencing_document_is_refused_as_dumps_does() -> None:
    doc: dict[str, Any] = {"state": {}}
    doc["state"]["me"] = doc
    assert outcome(dumps_document, doc) == outcome(dumps, doc) == ("raised", ValueError)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(JSON)
def test_any_value_reads_back_as_dumps_writes_it(value: Any) -> None:
    """NaN and infinities included (``st.floats``): refused by both, with the same error."""
    assert outcome(dumps_document, {"state": value}) == outcome(dumps, {"state": value})
