"""The real-server tiers run against the server ``PLAITA_TEST_SERVER`` asks for (Redis or Valkey)."""

from __future__ import annotations

import os

import pytest
import redis

from tests.support.redis_server import SERVER_ENV

pytestmark = pytest.mark.redis


def test_the_private_server_is_the_requested_kind(rclient: redis.Redis) -> None:
    info = rclient.info("server")
    is_valkey = str(info.get("server_name", "")).lower() == "valkey"
    assert is_valkey == (os.environ.get(SERVER_ENV) == "valkey"), info.get("server_name")
