"""``python -m bench.countrt <module> args…``: run ``<module>`` (e.g. ``plaita``) counting its
Redis round trips: every ``send_packed_command`` of redis-py is one request written to a socket
(a pipeline is one), as is every write of a flow runner's loop connection
(``plaita.store.executions.loop_calls``); the count goes to ``$PLAITA_BENCH_RT_FILE`` every 20 ms and at
exit."""

from __future__ import annotations

import atexit
import itertools
import os
import runpy
import sys
import threading
from pathlib import Path

import redis.connection

_sent = itertools.count()
_last = [0]
_original = redis.connection.AbstractConnection.send_packed_command


def _counted(self: object, command: object, check_health: bool = True) -> None:
    _last[0] = next(_sent) + 1  # itertools.count is atomic under the GIL
    _original(self, command, check_health)  # type: ignore[arg-type]


def _write(path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(str(_last[0]))
    tmp.replace(path)


def _flusher(path: Path) -> None:
    while True:
        _write(path)
        threading.Event().wait(0.02)


def _count_loop_writes() -> None:
    """A loop connection's write (``plaita.store.executions.loop_calls``) is one request too; a tree
    without that module (an older baseline) has none to count."""
    try:
        from plaita.store.executions import loop_calls
    except ImportError:
        return
    original = loop_calls._Connection._write

    def counted(self: loop_calls._Connection, data: bytes) -> None:
        _last[0] = next(_sent) + 1
        original(self, data)

    loop_calls._Connection._write = counted  # type: ignore[method-assign]


def read_round_trips(path: Path) -> int:
    """What the counted process has written to ``path`` so far (0 before its first write)."""
    try:
        return int(path.read_text() or 0)
    except (OSError, ValueError):
        return 0


def main() -> None:
    path = Path(os.environ["PLAITA_BENCH_RT_FILE"])
    redis.connection.AbstractConnection.send_packed_command = _counted  # type: ignore[method-assign]
    _count_loop_writes()
    threading.Thread(target=_flusher, args=(path,), daemon=True).start()
    atexit.register(_write, path)
    module, sys.argv = sys.argv[1], sys.argv[1:]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
