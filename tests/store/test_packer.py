"""The worker clients' command packer sends exactly the bytes redis-py's hiredis packer sends."""

from __future__ import annotations

from typing import Any

import pytest
from redis.connection import HiredisRespSerializer
from redis.exceptions import DataError

from plaita.store.client import _PACKER, _Packer

CASES: list[tuple[Any, ...]] = [
    ("XACK", "s", "g", "1-0", "1700000000000-12", "0/1-0"),
    ("XDEL", b"s", *(f"{i}-0" for i in range(300))),
    ("CLIENT SETNAME", "plaita"),  # a command name of two words is split
    (b"CLIENT LIST",),
    ("SET", "k", 7, 2.5, -1, 0.1),
    ("SET", "k", bytearray(b"v\x00w")),  # hiredis refuses bytearray: the generic path converts it
    ("SET", "k", memoryview(b"\xff\xfe")),
    ("EVALSHA", "abc", 1, "key", "ünïcode", "\udc80".encode("utf-8", "surrogateescape")),
    ("PING",),
]


@pytest.mark.parametrize("args", CASES)
def test_the_same_bytes_as_redis_py(args: tuple[Any, ...]) -> None:
    assert _Packer().pack(*args) == HiredisRespSerializer().pack(*args)


def test_an_argument_of_another_type_is_refused_as_redis_py_refuses_it() -> None:
    for packer in (_Packer(), HiredisRespSerializer()):
        with pytest.raises(DataError):
            packer.pack("SET", "k", object())


def test_the_worker_clients_use_it() -> None:
    from plaita.store.client import make_client

    client = make_client("redis://127.0.0.1:1/0", socket_timeout_s=1.0)
    try:
        assert client.connection_pool.connection_kwargs.get("command_packer") is _PACKER
        assert _PACKER is None or client.connection_pool.make_connection()._command_packer is _PACKER
    finally:
        client.close()
