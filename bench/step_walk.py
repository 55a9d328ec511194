"""The walk of one flow step, measured: which files of ``plaita/`` a start task passes through
from its arrival (``FlowRunner.run_async``) to the return of its checkpoint write
(``Checkpointer.write``), and how often it comes back to a file it had left.

How. A one-step flow's start task runs through ``run_async`` on an event loop, as a flow worker
runs it (the real adapter, a private redis-server, the loop's own connection). ``sys.setprofile``
sees every Python call and return on that thread; after each one the *current file* is the file
of the innermost frame inside ``plaita/`` (frames of asyncio, redis-py and the step itself are
skipped). A *stay* is a run of events in one current file; a *return* is a stay in a file the
walk had already left. Two counts are printed:

- ``all``: every stay, helpers included (a property of ``Execution``, a key name of
  ``Keyspace``): what a debugger stepping into every call would show;
- ``path``: only the files the walk passes *through*: a stay in a file whose code calls into no
  other plaita file before it returns (a leaf: a value's method, a key builder, a parser) is
  dropped, and the stays on either side of it are one. This is the walk a reader follows.

Also printed: how many sibling modules ``engine.py`` imports (modules of its own package) and
how many times ``offload`` is still written in ``plaita/flows/`` (the runner's old mode flag;
how calls travel is ``plaita/store/executions/execution_io.py``'s choice now).

    python -m bench.step_walk [--root DIR] [--show]

``--root`` measures another checkout (its ``plaita`` and ``tests`` are imported instead).
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import re
import sys
from pathlib import Path
from types import FrameType
from typing import Any


def _walk(root: Path) -> list[tuple[str, bool]]:
    """(file, leaf) per stay of the traced run, in order."""
    from plaita.flows import Flow, FlowRunner
    from plaita.store.client import make_client
    from plaita.store.executions.store import ExecutionStore
    from plaita.store.leases import LeaseManager
    from plaita.tasks import Task
    from tests.support.redis_server import RedisServer

    flow = Flow("walk")

    @flow.step
    def only(ctx: Any) -> int:
        return 1

    package = str(root / "plaita") + "/"
    events: list[str] = []  # the current file after each call and return
    calls: list[tuple[str, bool]] = []  # the file of each plaita function called, resumed or not
    started: set[FrameType] = set()
    stop = {"now": False}

    def innermost(frame: FrameType | None) -> str | None:
        while frame is not None:
            name = frame.f_code.co_filename
            if name.startswith(package):
                return name[len(package) :]
            frame = frame.f_back
        return None

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if stop["now"] or event not in ("call", "return"):
            return
        where = innermost(frame if event == "call" else frame.f_back)
        if where is not None:
            events.append(where)
            if event == "call" and frame.f_code.co_filename.startswith(package):
                calls.append((where, frame in started))  # a coroutine resumed is no new call
                started.add(frame)
        if event == "return" and frame.f_code.co_name == "write" and frame.f_code.co_filename.endswith("checkpoint.py"):
            stop["now"] = True

    with RedisServer(persist=False) as server:
        client = make_client(server.url, socket_timeout_s=5.0)
        runner = FlowRunner([flow], ExecutionStore(client))
        leases = LeaseManager(client, consumer="walk", ttl_s=30.0)
        warm = Task("0-1", {"type": "start", "flow_id": "walk", "execution_id": "warm", "params": {}}, 1)
        task = Task("0-2", {"type": "start", "flow_id": "walk", "execution_id": "e1", "params": {}}, 1)
        for t in (warm, task):
            lease = leases.acquire(t.execution_id)
            assert lease is not None
            t.fencing_token = lease.generation  # type: ignore[union-attr]

        async def run() -> None:
            await runner.run_async(warm)  # scripts loaded, connections made: not part of the walk
            sys.setprofile(profile)
            try:
                await runner.run_async(task)
            finally:
                sys.setprofile(None)

        asyncio.run(run())
        runner.close()
        client.close()
    CALLS[:] = calls
    return _stays(events)


CALLS: list[tuple[str, bool]] = []


def _stays(events: list[str]) -> list[tuple[str, bool]]:
    """Collapse events into stays; a stay is a leaf when the walk comes straight back to the
    file it came from (it called into no third file)."""
    stays: list[str] = []
    for name in events:
        if not stays or stays[-1] != name:
            stays.append(name)
    out: list[tuple[str, bool]] = []
    for i, name in enumerate(stays):
        leaf = 0 < i < len(stays) - 1 and stays[i - 1] == stays[i + 1]
        out.append((name, leaf))
    return out


def _count(stays: list[str]) -> tuple[int, int, int]:
    """(stays, files, returns)."""
    merged: list[str] = []
    for name in stays:
        if not merged or merged[-1] != name:
            merged.append(name)
    files = len(set(merged))
    return len(merged), files, len(merged) - files


def _engine_siblings(root: Path) -> list[str]:
    engine = next(root.joinpath("plaita", "flows").rglob("engine.py"))
    package = ".".join(engine.relative_to(root).with_suffix("").parts[:-1])
    siblings: set[str] = set()
    for node in ast.walk(ast.parse(engine.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith(package + ".") and node.module.count(".") == package.count(".") + 1:
                siblings.add(node.module.rsplit(".", 1)[1])
            elif node.module == package:
                siblings.update(a.name for a in node.names)
    return sorted(siblings)


def _offloads(root: Path) -> list[str]:
    """Every mention of ``offload`` in ``plaita/flows/`` (the runner's mode flag lived there)."""
    hits = []
    for path in sorted(root.joinpath("plaita", "flows").rglob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"offload", line, re.IGNORECASE):
                hits.append(f"{path.relative_to(root)}:{n}: {line.strip()}")
    return hits


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    parser.add_argument("--show", action="store_true", help="print the path, one stay a line")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    sys.path.insert(0, str(root))
    stays = _walk(root)
    all_stays, all_files, all_returns = _count([s for s, _ in stays])
    path = [s for s, leaf in stays if not leaf]
    path_stays, path_files, path_returns = _count(path)
    siblings = _engine_siblings(root)
    offloads = _offloads(root)
    print(f"tree: {root}")
    print(f"all:  {all_stays} stays in {all_files} files, {all_returns} returns to a file already left")
    print(f"path: {path_stays} stays in {path_files} files, {path_returns} returns to a file already left")
    fresh = [f for f, resumed in CALLS if not resumed]
    c_stays, c_files, c_returns = _count(fresh)
    print(f"calls: {c_stays} stays in {c_files} files, {c_returns} returns (calls only, resumptions left out)")
    print(f"engine imports {len(siblings)} siblings: {', '.join(siblings)}")
    print(f"offload in plaita/flows: {len(offloads)}")
    for hit in offloads if args.show else []:
        print("  " + hit)
    if args.show:
        merged: list[str] = []
        for name in path:
            if not merged or merged[-1] != name:
                merged.append(name)
        seen: set[str] = set()
        for name in merged:
            print(("  (return) " if name in seen else "  ") + name)
            seen.add(name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
