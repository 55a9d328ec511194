"""The Lua registry: one file per script, headers that name every key, EVALSHA with NOSCRIPT reload."""

from __future__ import annotations

import re

import pytest
import redis

from plaita.store import scripts
from plaita.store.scripts import SCRIPTS, Script

KEY_REF = re.compile(r"KEYS\[(\d+)\]")


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_header_lists_every_key_the_body_uses(name: str) -> None:
    """A fixed-key script's header documents KEYS[1..n] exactly; its body uses no other index."""
    script = SCRIPTS[name]
    header = "\n".join(ln for ln in script.source.splitlines() if ln.startswith("--"))
    body = "\n".join(ln for ln in script.source.splitlines() if not ln.startswith("--"))
    assert "-- Returns" in header, f"{name}: the header must say what the script returns"
    if script.num_keys is None:
        return
    documented = {int(i) for i in KEY_REF.findall(header)}
    used = {int(i) for i in KEY_REF.findall(body)}
    assert documented == set(range(1, script.num_keys + 1)), name
    assert used <= documented, f"{name} touches keys its header does not list: {used - documented}"


def test_file_names_must_carry_the_key_count() -> None:
    with pytest.raises(ValueError, match="must be named"):
        Script("claim.lua", "return 1")
    assert Script("x-3.lua", "return 1").num_keys == 3
    assert Script("x-n.lua", "return 1").num_keys is None


def test_wrong_key_count_is_refused_before_redis_is_asked() -> None:
    with pytest.raises(ValueError, match="takes 3 keys"):
        SCRIPTS["fenced_set"].queue(None, ["a"], [])  # type: ignore[arg-type]


@pytest.mark.redis
def test_every_script_loads_and_a_flushed_cache_is_reloaded(redis_url: str) -> None:
    """The server compiles every file; after SCRIPT FLUSH a call loads the script and runs once."""
    client = redis.Redis.from_url(redis_url)
    try:
        for script in SCRIPTS.values():
            assert client.script_load(script.source) == script.sha
        client.script_flush()
        assert int(SCRIPTS["release_orphan"](client, ["plaita:test:lease:x"], ["worker:me@1"])) == 0
        assert client.script_exists(SCRIPTS["release_orphan"].sha) == [True]
        client.script_flush()
        scripts.ensure_loaded(client, [SCRIPTS["release_leases"], SCRIPTS["renew_lease"]])
        assert client.script_exists(SCRIPTS["release_leases"].sha, SCRIPTS["renew_lease"].sha) == [True, True]
    finally:
        client.close()
