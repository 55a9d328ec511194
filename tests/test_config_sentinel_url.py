"""``redis+sentinel://[user:pass@]host:port[,host:port]/service[/db]`` parsing and redaction."""

from __future__ import annotations

import pytest

from plaita.config import Settings, parse_sentinel_url, redact_url
from plaita.errors import ConfigError


def test_parses_sentinels_service_db_and_credentials() -> None:
    t = parse_sentinel_url("redis+sentinel://app:s3cret@10.0.0.1:26379,10.0.0.2:26380/orders/2")
    assert t.sentinels == [("10.0.0.1", 26379), ("10.0.0.2", 26380)]
    assert (t.service, t.db, t.username, t.password) == ("orders", 2, "app", "s3cret")
    assert parse_sentinel_url("redis+sentinel://127.0.0.1:26379/mymaster").db == 0


@pytest.mark.parametrize(
    "url",
    [
        "redis+sentinel://:pw@127.0.0.1:26379",  # no service
        "redis+sentinel://:pw@127.0.0.1/mymaster",  # no port
        "redis+sentinel://:pw@127.0.0.1:26379/mymaster/x",  # db not a number
        "redis+sentinel://:pw@127.0.0.1:99999/mymaster",  # port out of range
    ],
)
def test_malformed_sentinel_urls_are_config_errors_without_the_password(url: str) -> None:
    with pytest.raises(ConfigError) as exc:
        Settings(redis_url=url)
    assert "pw" not in str(exc.value)


def test_password_is_redacted() -> None:
    assert "s3cret" not in redact_url("redis+sentinel://app:s3cret@h1:1,h2:2/svc")
