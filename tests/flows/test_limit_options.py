"""Flow limits without a server: the options a Flow takes are checked (bad ones are configuration
errors naming the option), per-key configuration is checked, and the limit keys share one hash tag
of their own that user-supplied concurrency keys cannot break."""

from __future__ import annotations

from typing import Any

import pytest

from plaita.errors import ConfigError
from plaita.flows import Flow
from plaita.store.executions.flow_limits import (
    KEY_NAME_MAX,
    flow_keys,
    key_scope,
    limit_keys,
)
from plaita.store.keyspace import DEFAULT, Keyspace, hash_tag


def test_limit_keys_share_one_hash_tag_of_their_own() -> None:
    """Every script touches keys of one slot (Redis Cluster), apart from the partitions' tags."""
    for ks in (DEFAULT, Keyspace("q", partitions=4, tagged=True)):
        keys = limit_keys(ks, "my}flow")
        assert len({hash_tag(k) for k in keys}) == 1
        assert hash_tag(keys[0]) not in ks.tags


@pytest.mark.parametrize(
    "options",
    [{"max_concurrent": 0}, {"max_concurrent": True}, {"max_concurrent": 1.5}, {"max_starts_per_s": 0},
     {"max_starts_per_s": float("nan")}, {"max_starts_per_s": "5"}],
)  # fmt: skip
def test_bad_limits_are_config_errors(options: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match="max_"):
        Flow("f", **options)


@pytest.mark.parametrize("value", [(0, 1.0), (1.5, 1.0), (True, 1.0), (3, 0), (3, -1.0), (3, float("inf")), (3,), 5])
def test_bad_rate_limits_are_config_errors(value: Any) -> None:
    """Issue 31 item 5: N an int >= 1, period_s a finite number > 0."""
    with pytest.raises(ConfigError):
        Flow("bad", rate_limit=value)


def test_per_key_configuration_is_checked() -> None:
    with pytest.raises(ConfigError, match="concurrency_key"):
        Flow("f", max_concurrent_per_key=1)
    with pytest.raises(ConfigError, match="max_concurrent_per_key"):
        Flow("f", concurrency_key="c")
    with pytest.raises(ConfigError, match="max_concurrent_per_key must be"):
        Flow("f", max_concurrent_per_key=0, concurrency_key="c")
    with pytest.raises(ConfigError, match="cannot be combined"):
        Flow("f", max_concurrent=2, max_concurrent_per_key=1, concurrency_key="c")


def test_user_keys_cannot_break_key_names() -> None:
    """A key holding ``:``, ``%``, braces or a megabyte stays one name part of bounded length, in
    the flow's own hash tag (one slot on a cluster); two keys that differ only in escaping differ."""
    ks = Keyspace("plaita:q")
    keys = ["a:b", "a%3Ab", "{x}", "}", "", "x" * KEY_NAME_MAX, "x" * (KEY_NAME_MAX + 1), "é" * 1_000_000]
    scopes = [key_scope(k) for k in keys]
    assert len(set(scopes)) == len(keys)
    assert all(":" not in s and len(s) <= KEY_NAME_MAX + 2 for s in scopes)
    flow_tag = hash_tag(flow_keys(ks, "charge").slots)
    for k in keys:
        fk = flow_keys(ks, "charge", k)
        assert {hash_tag(x) for x in (fk.slots, fk.owners, fk.parked, fk.parked_tasks, fk.limits)} == {flow_tag}
