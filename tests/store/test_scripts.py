"""The Lua registry: one file per script, headers that name every key, shared pieces assembled at
load, EVALSHA with NOSCRIPT reload."""

from __future__ import annotations

import hashlib
import re
from typing import Any

import pytest
import redis

from plaita.store import scripts
from plaita.store.scripts import INCLUDES, SCRIPTS, Script

KEY_REF = re.compile(r"KEYS\[(\d+)\]")
FENCED = ("checkpoint_execution", "create_execution", "fenced_set", "publish_event", "reopen_execution")


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_header_lists_every_key_the_body_uses(name: str) -> None:
    """A fixed-key script's header documents KEYS[1..n] exactly; its body uses no other index."""
    script = SCRIPTS[name]
    # The header is read from the file as written, the body from what the server runs.
    header = "\n".join(ln for ln in script.text.splitlines() if ln.startswith("--"))
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


def test_every_include_is_used_and_names_no_key_of_its_own() -> None:
    """A piece no script pulls in is dead; one that reads KEYS or ARGV would hide a key from a header."""
    used = {name for script in SCRIPTS.values() for name in script.includes}
    assert set(INCLUDES) == used
    for name, text in INCLUDES.items():
        code = "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("--"))
        assert "KEYS" not in code and "ARGV" not in code, f"include {name} must take its keys as arguments"


def test_the_fenced_scripts_share_one_fence_check() -> None:
    for name in FENCED:
        assert SCRIPTS[name].includes[0] == "fence", name
        assert INCLUDES["fence"] in SCRIPTS[name].source
    for name in ("checkpoint_execution", "checkpoint_running", "create_execution"):  # their first write
        assert SCRIPTS[name].includes == ("fence", "index_write"), name


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_the_assembled_source_has_no_directive_left(name: str) -> None:
    assert "@include" not in SCRIPTS[name].source


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ('--- @include "nope"', "unknown include 'nope' \\(known: fence, flow_slots, index_write\\)"),
        ("--- @include fence", "write an include as a whole line"),
        ('  --- @include "fence"', "write an include as a whole line"),
        ('--- @include "fence"\n--- @include "fence"', "include 'fence' is already included"),
    ],
)
def test_a_bad_directive_is_a_clear_error_at_load(line: str, why: str) -> None:
    with pytest.raises(ValueError, match=rf"'x-1.lua' line \d: {why}"):
        Script("x-1.lua", f"{line}\nreturn 1")


def test_includes_do_not_nest() -> None:
    with pytest.raises(ValueError, match="includes do not nest"):
        Script("x-1.lua", '--- @include "a"\nreturn 1', {"a": '--- @include "b"\n', "b": ""})


def test_the_sha_is_of_the_assembled_source() -> None:
    script = Script("x-1.lua", '--- @include "a"\nreturn f()', {"a": "local function f() return 1 end"})
    assert script.source == "local function f() return 1 end\nreturn f()"
    assert script.sha == hashlib.sha1(script.source.encode()).hexdigest()
    assert script.includes == ("a",)


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


#: Lease and fence values a fenced write must refuse, each as (lease value, fence value); a dict
#: is written as a hash (a key of another type). The writer's generation is 5.
HOSTILE = {
    "no lease": (None, "5"),
    "lease of another generation": ("worker:w@1:4", "5"),
    "lease of a longer generation": ("worker:w@1:15", "5"),
    "newer fence": ("worker:w@1:5", "6"),
    "fence not an integer": ("worker:w@1:5", "five"),
    "lease is a hash": ({"v": "worker:w@1:5"}, "5"),
    "fence is a hash": ("worker:w@1:5", {"v": "5"}),
}


#: What a v2 lease looks like to a fenced write (docs/reliability.md, "Lease format"): its
#: generation came from the partition's counter, so the execution's fence key is absent or older.
V2_HOLDER = {
    "no fence": ("worker:w@1:5", None),
    "older fence": ("worker:w@1:5", "3"),
}


def _fenced_call(name: str) -> tuple[list[str], list[str], object]:
    """Keys and args to run ``name`` as generation 5 writing key ``w:state``, and its refusal reply."""
    if name == "fenced_set":
        return ["w:lease", "w:fence", "w:state"], ["5", "v"], 0
    if name == "publish_event":  # ``w:state`` is the events hash it writes; ``w:doc`` only lends its TTL
        return ["w:lease", "w:fence", "w:state", "w:doc"], ["5", "progress", "{}", "100"], 0
    if name == "create_execution":
        keys = ["w:lease", "w:fence", "w:state", "w:running", "w:cancel", "w:queued", "w:error"]
        return keys, ["5", "{}", "1", "e", "60"], [0, "", 0]
    keys = ["w:lease", "w:fence", "w:state", "w:cancel", "w:deadlines"] + [f"w:idx:{i}" for i in range(5)]
    if name == "reopen_execution":
        return keys, ["5", "{}", "1", "e"], [0]
    return keys, ["5", "{}", "1", "1", "e", "", "0", "0"], [0, 0]


def _put(client: redis.Redis, key: str, value: str | dict[str, str] | None) -> None:
    if isinstance(value, dict):
        client.hset(key, mapping=value)
    elif value is not None:
        client.set(key, value)


@pytest.mark.redis
@pytest.mark.parametrize("case", sorted(HOSTILE))
@pytest.mark.parametrize("name", FENCED)
def test_every_fenced_script_refuses_a_writer_that_lost_the_fence(redis_url: str, name: str, case: str) -> None:
    """Every fenced script refuses the same way, and writes nothing; the holder itself is let through."""
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        lease, fence = HOSTILE[case]
        assert _fenced_run(client, name, lease, fence) == "refused"
        assert sorted(client.keys("w:*")) == sorted(k for k, v in (("w:lease", lease), ("w:fence", fence)) if v)
        client.delete("w:lease", "w:fence")
        assert _fenced_run(client, name, "worker:w@1:5", "5") == "ran"
        assert client.exists("w:state") == 1
    finally:
        client.close()


def _fenced_run(client: redis.Redis, name: str, lease: Any, fence: Any) -> str:
    """Run the fenced script ``name`` with this lease and fence in place: "refused" or "ran"."""
    keys, args, refused = _fenced_call(name)
    _put(client, "w:lease", lease)
    _put(client, "w:fence", fence)
    return "refused" if SCRIPTS[name](client, keys, args) == refused else "ran"


@pytest.mark.redis
@pytest.mark.parametrize("case", sorted(V2_HOLDER))
@pytest.mark.parametrize("name", FENCED)
def test_every_fenced_script_lets_a_v2_holder_through(redis_url: str, name: str, case: str) -> None:
    """A lease naming the writer's generation with no newer fence is held, in every fenced script."""
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        assert _fenced_run(client, name, *V2_HOLDER[case]) == "ran"
        assert client.exists("w:state") == 1
    finally:
        client.close()
