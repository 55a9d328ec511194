"""Ask a worker's own health endpoint what it is doing, for when Redis cannot be read.

During an outage the registry is exactly what nobody can read, yet that is when an operator
most wants each worker's state. A worker started with ``--metrics-port`` publishes its metrics
address in its registry entry; the dashboard remembers it and reads ``/metrics`` (the
``plaita_worker_state`` gauge) and ``/readyz`` (the reason) straight from the worker.
"""

from __future__ import annotations

import ipaddress
import urllib.error
import urllib.request
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

#: Seconds one probe request may take: the sampler probes every known worker each round.
PROBE_TIMEOUT_S = 0.5
#: Most workers probed in one round, so a round stays bounded in time.
MAX_PROBED = 20
#: Addresses a worker may bind its metrics server to that are not reachable as such.
_WILDCARDS = {"", "0.0.0.0", "::", "[::]"}


def probe_address(entry: dict[str, Any]) -> tuple[str, int] | None:
    """(host, port) of a registry entry's health endpoint, or None when it has none."""
    port = entry.get("metrics_port")
    if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
        return None
    host = str(entry.get("metrics_host") or "")
    if host in _WILDCARDS:
        # The registry's ``host`` is ``hostname/ip``: the ip reaches a wildcard-bound server.
        host = str(entry.get("host") or "").rpartition("/")[2]
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None  # only literal addresses: a name from Redis is not resolved by the dashboard
    return host, port


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=PROBE_TIMEOUT_S) as response:
            return int(response.status), response.read(1_000_000).decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read(10_000).decode("utf-8", "replace")


def probe(host: str, port: int) -> dict[str, Any] | None:
    """The worker's live state, in-flight count and readiness, or None if it does not answer."""
    base = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
    try:
        code, text = _get(f"{base}/metrics")
        if code != 200:
            return None
        ready_code, reason = _get(f"{base}/readyz")
    except (OSError, ValueError):
        return None
    state = None
    in_flight = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "plaita_worker_state" and sample.value == 1:
                state = sample.labels.get("state")
            elif sample.name == "plaita_worker_in_flight":
                in_flight = int(sample.value)
    if state is None:
        return None
    return {"state": state, "in_flight": in_flight, "ready": ready_code == 200, "ready_reason": reason.strip()}
