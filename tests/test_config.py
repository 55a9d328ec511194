"""Settings validation and the metrics-port probe. Pure apart from a loopback socket."""

from __future__ import annotations

from typing import Any

import pytest

from plaita.config import MAX_MS, Settings
from plaita.errors import ConfigError

URL = "redis://127.0.0.1:1/0"


def make(**kw: Any) -> Settings:
    return Settings(redis_url=URL, consumer_name="c", **kw)


@pytest.mark.parametrize(
    ("field", "value", "flag"),
    [
        pytest.param("claim_min_idle_ms", 99999999999999999999, "--claim-min-idle-ms", id="claim-min-idle-huge"),
        pytest.param("claim_min_idle_ms", MAX_MS + 1, "--claim-min-idle-ms", id="claim-min-idle-over-int32"),
        pytest.param("consumer_prune_idle_s", float("nan"), "--consumer-prune-idle-s", id="prune-nan"),
        pytest.param("lease_ttl_s", float("inf"), "--lease-ttl-seconds", id="lease-inf"),
        pytest.param("lease_ttl_s", 8 * 24 * 3600.0, "--lease-ttl-seconds", id="lease-over-a-week"),
        pytest.param("drain_timeout_s", float("nan"), "--drain-timeout-s", id="drain-nan"),
        pytest.param("drain_timeout_s", float("-inf"), "--drain-timeout-s", id="drain-minus-inf"),
        pytest.param("reclaim_interval_s", float("inf"), "--reclaim-interval-s", id="reclaim-inf"),
        pytest.param("registry_ttl_s", float("nan"), "--registry-ttl", id="registry-ttl-nan"),
        pytest.param("heartbeat_interval_s", float("nan"), "--heartbeat-interval", id="heartbeat-nan"),
        pytest.param("max_deliveries", 2**40, "--max-deliveries", id="max-deliveries-huge"),
        pytest.param("metrics_port", 70000, "--metrics-port", id="port-over-65535"),
        pytest.param("max_payload_bytes", 2**40, "--max-payload-bytes", id="payload-limit-huge"),
    ],
)
def test_out_of_range_value_is_one_line_config_error(field: str, value: Any, flag: str) -> None:
    """Each value the issue found accepted (nan, inf, beyond int32 ms) is refused, naming its flag."""
    with pytest.raises(ConfigError) as info:
        make(**{field: value})
    message = str(info.value)
    assert flag in message
    assert "\n" not in message


def test_defaults_and_edges_are_accepted() -> None:
    s = make(claim_min_idle_ms=MAX_MS, lease_ttl_s=7 * 24 * 3600.0, consumer_prune_idle_s=0.0, metrics_port=0)
    assert s.claim_min_idle_ms == MAX_MS
