"""The worker clients' command packer sends exactly the bytes redis-py's hiredis packer sends."""

from __future__ import annotations

from typing import Any

import pytest
from redis.connection import HiredisRespSerializer
from redis.exceptions import DataError

from plaita.store.client import _PACKER, PACK_TEXT_MIN_ARGS, _Packer
from plaita.store.resp import pack_text

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


class _Text(str):
    """A text subclass whose format() and str() are not its text: packed by its raw text, as hiredis does."""

    def __format__(self, spec: str) -> str:
        return "formatted"

    def __str__(self) -> str:
        return "str"


#: Commands long enough for ``plaita.store.resp.pack_text`` (PACK_TEXT_MIN_ARGS arguments or more).
LONG_CASES: list[tuple[Any, ...]] = [
    ("XACK", "s", "g", *(f"{i}-0" for i in range(300))),
    ("EVALSHA", "a" * 40, "3", "k1", "k2", "k3", "v1", "v2", "v3"),
    ("EVALSHA", "a" * 40, 3, "k1", "k2", "k3", "v1", "v2", "v3"),  # a number: hiredis packs it
    ("XDEL", "s", "ünïcode", *"abcdefgh"),
    ("XDEL", "s", _Text("a-text"), *"abcdefgh"),
    ("XDEL", "s", "x" * 1023, "", *"abcdefgh"),
    ("XDEL", "s", "x" * 1024, *"abcdefgh"),  # longer than the length table
    ("CLIENT SETNAME", *"abcdefghij"),
    (b"XDEL", *"abcdefghij"),
    ("XDEL", b"s", *"abcdefghij"),
]


@pytest.mark.parametrize("args", LONG_CASES)
def test_a_long_command_is_the_same_bytes_as_redis_py(args: tuple[Any, ...]) -> None:
    assert len(args) >= PACK_TEXT_MIN_ARGS
    assert _Packer().pack(*args) == HiredisRespSerializer().pack(*args)


def test_only_ascii_text_is_packed_without_hiredis() -> None:
    assert pack_text(("XDEL", "s", "1-0")) == b"*3\r\n$4\r\nXDEL\r\n$1\r\ns\r\n$3\r\n1-0\r\n"
    for args in (("XDEL", "s", "é"), ("XDEL", b"s"), ("SET", "k", 1), ("XDEL", "x" * 1024)):
        assert pack_text(args) is None


def test_a_lone_surrogate_is_refused_as_redis_py_refuses_it() -> None:
    for packer in (_Packer(), HiredisRespSerializer()):
        with pytest.raises(UnicodeEncodeError):
            packer.pack("XDEL", "s", "\udc80", *"abcdefgh")
