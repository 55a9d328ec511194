"""Ask a worker's own health endpoint what it is doing, for when Redis cannot be read.

During an outage the registry is exactly what nobody can read, yet that is when an operator
most wants each worker's state. A worker started with ``--metrics-port`` publishes its metrics
address in its registry entry; the dashboard remembers it and reads ``/metrics`` (the
``plaita_worker_state`` gauge) and ``/readyz`` (the reason) straight from the worker.

Whoever can write one registry key chooses the address the dashboard fetches, so the probe
must not become a way to read other HTTP pages through the dashboard: it speaks HTTP/1.0 on
a raw socket to the literal address only (never following a redirect, never resolving a
name), reads at most a few KB within a time bound, and shows nothing it fetched: only a
state that is one of the worker's state names, a bounded count, and a readiness reason from
a fixed list. Anything else is "unparseable"; no answer is "unreachable" (no row update).
"""

from __future__ import annotations

import ipaddress
import re
import socket
import time
from typing import Any

from plaita.fsm import State

#: Seconds one probe request may take in all (connect, send, every read): the sampler probes
#: every known worker each round.
PROBE_TIMEOUT_S = 0.5
#: Most workers probed in one round, so a round stays bounded in time.
MAX_PROBED = 20
#: Most bytes read of one answer (headers included). The state gauge is near the top of
#: /metrics; an in-flight count beyond this is shown as unknown.
MAX_ANSWER_BYTES = 16 * 1024
#: Addresses a worker may bind its metrics server to that are not reachable as such.
_WILDCARDS = {"", "0.0.0.0", "::", "[::]"}
#: Largest in-flight count believed (a worker holds at most --concurrency + --prefetch).
_MAX_IN_FLIGHT = 1_000_000
_STATES = frozenset(s.name for s in State)
_STATUS_LINE = re.compile(rb"HTTP/1\.[01] (\d{3})[ \r]")
_STATE_SAMPLE = re.compile(r'plaita_worker_state\{state="([A-Z_]{1,32})"\} 1(?:\.0)?')
_IN_FLIGHT_SAMPLE = re.compile(r"plaita_worker_in_flight (\d{1,7})(?:\.0)?")

#: Readiness reasons shown, by how the worker's /readyz text starts (plaita/runtime/worker.py
#: ``readiness`` and outage.py ``reason``); the rest of its text is never shown.
_REASONS = (
    ("ok: ", "ok"),
    ("stopping", "stopping"),
    ("paused", "paused by remote command"),
    ("starting", "starting: consumer group not confirmed yet"),
    ("stalled", "stalled: no consume-loop progress"),
    ("backoff", "Redis failing (backoff)"),
    ("redis transient failure", "Redis failing (transient)"),
    ("redis persistent failure", "Redis failing (persistent)"),
    ("auth: ", "Redis refused the credentials"),
    ("acl: ", "Redis refused a permission (ACL)"),
    ("tls: ", "Redis refused the TLS handshake"),
)
UNPARSEABLE = "unparseable readiness answer"


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
    return host.strip("[]"), port


def _get(host: str, port: int, path: str) -> tuple[int, str] | None:
    """(status, body) of ``GET path``, at most MAX_ANSWER_BYTES read within PROBE_TIMEOUT_S in
    all; None when there is no well-formed HTTP answer. Redirects are answers like any other."""
    deadline_s = time.monotonic() + PROBE_TIMEOUT_S
    request = f"GET {path} HTTP/1.0\r\nHost: {host}\r\nAccept: text/plain\r\nConnection: close\r\n\r\n"
    data = bytearray()
    try:
        with socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S) as sock:
            sock.sendall(request.encode("ascii"))
            while len(data) < MAX_ANSWER_BYTES:
                left_s = deadline_s - time.monotonic()
                if left_s <= 0:
                    break
                sock.settimeout(left_s)
                chunk = sock.recv(MAX_ANSWER_BYTES - len(data))
                if not chunk:
                    break
                data += chunk
    except OSError:
        if not data:
            return None
    head, sep, body = bytes(data).partition(b"\r\n\r\n")
    status = _STATUS_LINE.match(head)
    if status is None or not sep:
        return None
    return int(status.group(1)), body.decode("utf-8", "replace")


def parse_metrics(text: str) -> tuple[str | None, int | None]:
    """(state, in_flight) from /metrics lines; the state only if it is a worker state name."""
    state = in_flight = None
    for line in text.splitlines():
        if state is None and (m := _STATE_SAMPLE.fullmatch(line)) and m.group(1) in _STATES:
            state = m.group(1)
        elif in_flight is None and (m := _IN_FLIGHT_SAMPLE.fullmatch(line)):
            in_flight = min(int(m.group(1)), _MAX_IN_FLIGHT)
    return state, in_flight


def parse_readiness(code: int | None, text: str) -> tuple[bool, str]:
    """(ready, reason): ready only for a 200 saying ``ok: <state>``; the reason is from a fixed
    list (what the worker's /readyz says, without its details), else UNPARSEABLE."""
    first = text.strip().splitlines()[0] if text.strip() else ""
    for prefix, reason in _REASONS:
        if first.startswith(prefix):
            ok = reason == "ok"
            return (ok, reason) if code == (200 if ok else 503) else (False, UNPARSEABLE)
    return False, UNPARSEABLE


def probe(host: str, port: int) -> dict[str, Any] | None:
    """The worker's live state, in-flight count and readiness, or None if it does not answer
    as a plaita worker (no answer, not 200, no known state)."""
    metrics = _get(host, port, "/metrics")
    if metrics is None or metrics[0] != 200:
        return None
    state, in_flight = parse_metrics(metrics[1])
    if state is None:
        return None
    readyz = _get(host, port, "/readyz")
    ready, reason = parse_readiness(readyz[0], readyz[1]) if readyz is not None else (False, "unreachable")
    return {"state": state, "in_flight": in_flight, "ready": ready, "ready_reason": reason}
