"""``python -m bench.rawloop URL STREAM GROUP CONSUMER``: the raw redis-py consume loop, until SIGTERM.

XREADGROUP COUNT 100 BLOCK 100, decode each payload, one pipelined XACK + XDEL per batch:
the least a consumer of the same stream must do, as the baseline for ``plaita worker``.
"""

from __future__ import annotations

import json
import signal
import sys
from types import FrameType
from typing import Any

import redis

#: Entries per XREADGROUP and its BLOCK.
RAW_COUNT = 100
RAW_BLOCK_MS = 100


def main(argv: list[str]) -> int:
    url, stream, group, consumer = argv
    stop = False

    def on_term(_signum: int, _frame: FrameType | None) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    client = redis.Redis.from_url(url, socket_timeout=10)
    client.xgroup_createconsumer(stream, group, consumer)  # the bench waits for it to show up
    while not stop:
        reply: Any = client.xreadgroup(group, consumer, {stream: ">"}, count=RAW_COUNT, block=RAW_BLOCK_MS)
        ids: list[bytes] = []
        for _stream, items in reply or []:
            for message_id, entry in items:
                json.loads(entry[b"payload"])
                ids.append(message_id)
        if ids:
            pipe = client.pipeline(transaction=False)
            pipe.xack(stream, group, *ids)
            pipe.xdel(stream, *ids)
            pipe.execute()
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
