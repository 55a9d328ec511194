"""The one way plaita runs Lua: every script is a file in ``plaita/store/lua/``, loaded once.

A file is named ``<name>-<keys>.lua``: ``<keys>`` is how many keys it touches, or ``n`` when
the caller passes a list. Its header lists each ``KEYS[i]``, ``ARGV[i]`` and the reply, so a
reader checks cluster safety (every key a script touches is passed in KEYS, never built in
Lua) without reading the body.

A piece several scripts share (the fence check) is written once in ``lua/includes/<name>.lua``
and pulled into a script by a line ``--- @include "<name>"``, replaced by that file when the
script is loaded: the server, the SHA and the NOSCRIPT reload all see the assembled source, and
the header stays in the script's own file. An include takes its keys as arguments, so the
header still names every key. A directive naming no include fails the import, not a call.

Scripts run as a bare EVALSHA. redis-py's ``Script`` objects make every pipeline that holds
one send ``SCRIPT EXISTS`` first: an extra round trip per read batch and per ack batch, most of
a worker's cost with a fast handler. Only when the server answers NOSCRIPT (it restarted and
lost its script cache) is the script loaded and the call or pipeline run once more. A pipeline
run that way must be safe to run twice: a NOSCRIPT reply means the scripts did not run, and
the plain commands beside them must be idempotent. A transaction that is not (``hand_back``
re-adds entries) calls ``ensure_loaded`` first.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping, Sequence
from importlib import resources
from typing import Any

import redis
from redis.client import Pipeline

_INCLUDE = re.compile(r'--- @include "([a-z0-9_]+)"')


def _read_lua(folder: str) -> dict[str, str]:
    """Every ``*.lua`` file of the package folder ``folder``, by file name, in name order."""
    root = resources.files("plaita.store")
    for part in folder.split("/"):
        root = root.joinpath(part)
    files = sorted((item for item in root.iterdir() if item.name.endswith(".lua")), key=lambda p: p.name)
    return {item.name: item.read_text(encoding="utf-8") for item in files}


#: Every shared piece, by name (the file name in ``lua/includes/`` without ``.lua``).
INCLUDES: dict[str, str] = {name.removesuffix(".lua"): text for name, text in _read_lua("lua/includes").items()}


def assemble(filename: str, text: str, includes: Mapping[str, str]) -> tuple[str, tuple[str, ...]]:
    """``text`` with each ``--- @include "name"`` line replaced by that include; and the names used.

    Any line that mentions ``@include`` must be a well-formed directive naming a known include,
    used once per script; an include cannot include another (one level keeps a script readable).
    """
    lines: list[str] = []
    used: list[str] = []
    for number, line in enumerate(text.splitlines(keepends=True), start=1):
        if "@include" not in line:
            lines.append(line)
            continue
        where = f"Lua file {filename!r} line {number}"
        match = _INCLUDE.fullmatch(line.rstrip("\r\n"))
        if match is None:
            raise ValueError(f'{where}: write an include as a whole line --- @include "<name>"')
        name = match[1]
        if name not in includes:
            raise ValueError(f"{where}: unknown include {name!r} (known: {', '.join(sorted(includes)) or 'none'})")
        if name in used:
            raise ValueError(f"{where}: include {name!r} is already included above")
        piece = includes[name]
        if "@include" in piece:
            raise ValueError(f"{where}: include {name!r} includes another; includes do not nest")
        lines.append(piece if piece.endswith("\n") else piece + "\n")
        used.append(name)
    return "".join(lines), tuple(used)


class Script:
    """One Lua file: its name, source (includes assembled), SHA1 and declared key count (None = a list)."""

    def __init__(self, filename: str, text: str, includes: Mapping[str, str] | None = None) -> None:
        stem = filename.removesuffix(".lua")
        self.name, _, keys = stem.rpartition("-")
        if not self.name or not (keys == "n" or keys.isdigit()):
            raise ValueError(f"Lua file {filename!r} must be named <name>-<keys|n>.lua")
        self.num_keys: int | None = None if keys == "n" else int(keys)
        #: The file as written: its header documents KEYS and ARGV.
        self.text = text
        #: What the server runs (and what the SHA is of): ``text`` with its includes in place.
        self.source, self.includes = assemble(filename, text, INCLUDES if includes is None else includes)
        self.sha = hashlib.sha1(self.source.encode("utf-8")).hexdigest()

    def _check(self, keys: Sequence[Any]) -> None:
        if self.num_keys is not None and len(keys) != self.num_keys:
            raise ValueError(f"script {self.name} takes {self.num_keys} keys, got {len(keys)}")

    def queue(self, pipe: Pipeline, keys: Sequence[Any], args: Sequence[Any]) -> None:
        """Queue this script on ``pipe`` (EVALSHA only)."""
        self._check(keys)
        # execute_command, not pipe.evalsha: redis-py's cluster pipeline blocks the method (not
        # the command); a script whose keys share one slot is routed to that slot's master.
        # numkeys as text: a call whose every argument is text skips hiredis (plaita.store.resp).
        pipe.execute_command("EVALSHA", self.sha, str(len(keys)), *keys, *args)  # type: ignore[no-untyped-call]

    def __call__(self, client: redis.Redis, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """Run it now: EVALSHA, and on NOSCRIPT load it and run it once more."""
        self._check(keys)
        try:
            return client.evalsha(self.sha, len(keys), *keys, *args)
        except redis.exceptions.NoScriptError:
            client.script_load(self.source)
            return client.evalsha(self.sha, len(keys), *keys, *args)


def _load_all() -> dict[str, Script]:
    scripts = (Script(filename, text) for filename, text in _read_lua("lua").items())
    return {script.name: script for script in scripts}


#: Every script, by name (the file name without ``-<keys>.lua``).
SCRIPTS: dict[str, Script] = _load_all()


def script(name: str) -> Script:
    return SCRIPTS[name]


def ensure_loaded(client: redis.Redis, scripts: Sequence[Script]) -> None:
    """Load whichever of ``scripts`` the server does not have (one round trip when all are there)."""
    present = client.script_exists(*(s.sha for s in scripts))
    for s, ok in zip(scripts, present, strict=True):
        if not ok:
            client.script_load(s.source)


def execute(
    client: redis.Redis,
    build: Callable[[Pipeline], None],
    scripts: Sequence[Script],
    *,
    transaction: bool,
    raise_on_error: bool = True,
) -> list[Any]:
    """Build a pipeline with ``build``, run it; on NOSCRIPT load ``scripts`` and run it again.

    With ``raise_on_error=False`` a failed command's exception is returned in its place (so a
    caller can tell one failing command from the rest); NOSCRIPT is still handled here.
    """
    for attempt in (0, 1):
        pipe = client.pipeline(transaction=transaction)
        build(pipe)
        try:
            results: list[Any] = pipe.execute(raise_on_error=raise_on_error)
        except redis.exceptions.NoScriptError:
            results = [redis.exceptions.NoScriptError()]
        if not any(isinstance(r, redis.exceptions.NoScriptError) for r in results):
            return results
        if attempt:
            raise next(r for r in results if isinstance(r, redis.exceptions.NoScriptError))
        for s in scripts:
            client.script_load(s.source)
    raise AssertionError("unreachable")  # pragma: no cover
