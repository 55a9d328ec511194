"""``copied_state``: the copy of the state each step's context gets, the same as ``copy.deepcopy``."""

from __future__ import annotations

import collections
import copy
import datetime
from typing import Any

from plaita.flows.model.validate import copied_state


def test_a_plain_state_is_copied_all_the_way_down() -> None:
    state: dict[str, Any] = {"n": 1, "f": 1.5, "s": "x", "b": True, "none": None, "items": [{"id": 1, "tags": ["a"]}]}
    copied = copied_state(state)
    assert copied == copy.deepcopy(state) and list(copied) == list(state)
    assert copied is not state and copied["items"] is not state["items"]
    assert copied["items"][0] is not state["items"][0] and copied["items"][0]["tags"] is not state["items"][0]["tags"]
    copied["items"][0]["tags"].append("b")
    assert state["items"][0]["tags"] == ["a"]


def test_shared_values_cycles_and_other_types_are_copied_as_deepcopy_copies_them() -> None:
    shared: list[Any] = [1, {"x": 2}]
    state: dict[Any, Any] = {
        "a": shared,
        "b": shared,
        "t": (1, [2]),
        "od": collections.OrderedDict(k=[1]),
        "d": datetime.date(2020, 1, 1),
        (1, 2): "tuple key",
        5: None,
    }
    state["me"] = state
    copied = copied_state(state)
    assert list(copied) == list(state)
    assert copied["a"] is copied["b"] and copied["a"] is not shared and copied["a"][1] is not shared[1]
    assert copied["me"] is copied
    assert copied["t"] == (1, [2]) and copied["t"][1] is not state["t"][1]
    assert type(copied["od"]) is collections.OrderedDict and copied["od"]["k"] is not state["od"]["k"]
    assert copied["d"] == state["d"] and copied[(1, 2)] == "tuple key" and copied[5] is None
