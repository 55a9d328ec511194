"""Alert webhooks: JSON events POSTed to an operator's URL (Slack, PagerDuty, a relay).

``emit`` never blocks: it puts the event on a bounded in-memory queue (full: the event is
dropped and counted) and one daemon thread sends it with a per-request timeout and a bounded
number of retries. ``close`` waits at most its timeout for what is queued, so a webhook that
is down or hangs never delays a stop; the thread is a daemon, so it never keeps a process
alive either. Every string sent is redacted (URL passwords) and the body is capped
(``MAX_BODY_BYTES``). The event schema is in docs/operations.md, "Alert webhooks".
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import http.client
import json
import logging
import queue
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from plaita.config import redact_text
from plaita.ops.deadline_http import DeadlineHTTPHandler, DeadlineHTTPSHandler
from plaita.version import __version__

logger = logging.getLogger(__name__)

#: Version of the event body; a change that breaks receivers bumps it.
SCHEMA_VERSION = 1
#: Largest body sent: longer strings are cut (longest first) until the body fits.
MAX_BODY_BYTES = 8 * 1024
#: No single string field is longer than this, whatever the body's size.
FIELD_MAX_CHARS = 2000
#: Events waiting to be sent at most; more are dropped (and counted) while the webhook lags.
QUEUE_SIZE = 1000
#: Each POST gives up after this, the whole exchange (connect, send, every read together).
REQUEST_TIMEOUT_S = 2.0
#: Tries per event (the first one included), with a doubling wait from RETRY_BASE_S between.
MAX_ATTEMPTS = 3
RETRY_BASE_S = 0.5
#: The longest a stop waits for queued events (nothing is retried once stopping): a webhook
#: that answers in milliseconds gets the last events; a hanging one costs a stop this much.
CLOSE_TIMEOUT_S = 0.1
#: HMAC-SHA256 of the exact body with the shared secret: ``sha256=<hex>``.
SIGNATURE_HEADER = "X-Plaita-Signature"
#: HTTP statuses worth another try (the rest of 4xx is a configuration problem: no retry).
RETRY_STATUSES = frozenset({408, 425, 429})

#: (outcome, event) -> None: ``sent``, ``failed`` or ``dropped`` (Prometheus counters).
CountHook = Callable[[str, str], None]

_STOP = object()


def webhook_label(url: str) -> str:
    """``scheme://host[:port]`` of ``url``, for logs: a webhook's path or query often is its token
    (a Slack URL), and its userinfo a password."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or "?"
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "<unparseable webhook url>"
    return f"{parts.scheme}://{host}{port}"


def sign(secret: str, body: bytes) -> str:
    """The ``X-Plaita-Signature`` value of ``body``."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def encode_event(doc: dict[str, Any], max_bytes: int = MAX_BODY_BYTES) -> bytes:
    """``doc`` as UTF-8 JSON of at most ``max_bytes``: strings redacted and cut to FIELD_MAX_CHARS,
    then the longest string halved until it fits (``"truncated": true`` says so)."""
    clean = {k: _clean(v) for k, v in doc.items() if v is not None}
    truncated = any(isinstance(v, str) and len(v) > FIELD_MAX_CHARS for v in clean.values())
    clean = {k: v[:FIELD_MAX_CHARS] if isinstance(v, str) else v for k, v in clean.items()}
    for _ in range(64):  # each round halves one string: bounded long before 64 rounds
        body = json.dumps({**clean, "truncated": truncated}, ensure_ascii=False, separators=(",", ":")).encode()
        if len(body) <= max_bytes:
            return body
        longest = max((k for k, v in clean.items() if isinstance(v, str)), key=lambda k: len(clean[k]), default=None)
        if longest is None or len(clean[longest]) <= 16:
            break
        clean[longest] = clean[longest][: len(clean[longest]) // 2] + "…"
        truncated = True
    # Only huge non-string values are left (a caller's bug): keep the envelope fields only.
    keep = ("schema_version", "event", "time", "source", "instance_id")
    return json.dumps({k: clean[k] for k in keep if k in clean} | {"truncated": True}).encode()[:max_bytes]


def _clean(value: Any) -> Any:
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is a failure: following one would POST the event (and its signature) to a URL
    nobody configured, or turn it into a GET without a body."""

    def redirect_request(self, *_args: Any, **_kwargs: Any) -> None:
        return None


class AlertSender:
    """A bounded queue of events and the thread that POSTs them (see the module docstring)."""

    def __init__(
        self,
        url: str,
        *,
        secret: str | None = None,
        identity: dict[str, Any] | None = None,
        on_count: CountHook | None = None,
        timeout_s: float = REQUEST_TIMEOUT_S,
        max_attempts: int = MAX_ATTEMPTS,
        retry_base_s: float = RETRY_BASE_S,
        queue_size: int = QUEUE_SIZE,
    ) -> None:
        self.url = url
        self.label = webhook_label(url)
        self._secret = secret
        #: Fields of every event: who sends it (source, instance_id, consumer, queue, host...).
        self.identity = dict(identity or {})
        self._on_count = on_count
        self.timeout_s = timeout_s
        self.max_attempts = max(1, max_attempts)
        self.retry_base_s = retry_base_s
        self._queue: queue.Queue[object] = queue.Queue(maxsize=max(1, queue_size))
        self._opener = urllib.request.build_opener(_NoRedirect(), DeadlineHTTPHandler(), DeadlineHTTPSHandler())
        self._closing = threading.Event()
        #: ``time.monotonic()`` past which a closing sender drops what is left.
        self._close_deadline_s = 0.0
        self._lock = threading.Lock()
        self.counts = {"sent": 0, "failed": 0, "dropped": 0}
        self._failing = False
        self._thread = threading.Thread(target=self._run, name="plaita-alerts", daemon=True)

    # -- the caller's side -------------------------------------------------------------
    def start(self) -> AlertSender:
        if self._thread.ident is None:
            self._thread.start()
            logger.info("alert webhook %s%s", self.label, " (signed)" if self._secret else "")
        return self

    def emit(self, event: str, fields: dict[str, Any], *, text: str = "") -> bool:
        """Queue one event; False if it was dropped (queue full, or stopping). Never blocks."""
        now = time.time()
        doc: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "event": event,
            "time": round(now, 3),
            "time_iso": datetime.fromtimestamp(now, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            **self.identity,
            **fields,
            "plaita_version": __version__,
            # Slack's incoming webhooks show ``text``; other receivers read the fields.
            "text": text or event,
        }
        if self._closing.is_set():
            self._count("dropped", event)
            return False
        try:
            self._queue.put_nowait(doc)
        except queue.Full:
            self._count("dropped", event)
            return False
        return True

    def begin_close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Start stopping: what is queued gets until ``timeout_s`` from now to go out (one try
        each, no retry waits), the rest is dropped. Returns at once (``close`` waits)."""
        if self._closing.is_set():
            return
        self._close_deadline_s = time.monotonic() + timeout_s
        self._closing.set()
        if self._thread.ident is not None:
            with contextlib.suppress(queue.Full):  # full: the thread ends by itself once it sees _closing
                self._queue.put_nowait(_STOP)

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """``begin_close`` (unless begun already) and wait for the thread until its deadline:
        returns within ``timeout_s`` however the webhook behaves."""
        self.begin_close(timeout_s)
        if self._thread.ident is not None:
            self._thread.join(max(0.0, self._close_deadline_s - time.monotonic()))
        with self._lock:
            counts = dict(self.counts)
        if any(counts.values()):
            logger.info(
                "alert webhook %s: %d sent, %d failed, %d dropped",
                self.label,
                counts["sent"],
                counts["failed"],
                counts["dropped"],
            )

    @property
    def backlog(self) -> int:
        return self._queue.qsize()

    # -- the thread ----------------------------------------------------------------------
    def _count(self, outcome: str, event: str) -> None:
        with self._lock:
            self.counts[outcome] += 1
        if self._on_count is not None:
            try:
                self._on_count(outcome, event)
            except Exception:  # metrics must never break alerting
                logger.debug("alert counter failed", exc_info=True)

    def _run(self) -> None:
        while True:
            try:
                # Closing with a full queue, _STOP may not be in it: do not wait for it forever.
                item = self._queue.get(timeout=0.1 if self._closing.is_set() else None)
            except queue.Empty:
                return
            if item is _STOP:
                self._drop_rest()
                return
            if self._closing.is_set() and time.monotonic() > self._close_deadline_s:
                self._drop(item)
                self._drop_rest()
                return
            assert isinstance(item, dict)
            self._deliver(item)

    def _drop(self, item: object) -> None:
        if isinstance(item, dict):
            self._count("dropped", str(item.get("event")))

    def _drop_rest(self) -> None:
        while True:
            try:
                self._drop(self._queue.get_nowait())
            except queue.Empty:
                return

    def _deliver(self, doc: dict[str, Any]) -> None:
        event = str(doc.get("event"))
        body = encode_event(doc)
        problem = ""
        for attempt in range(self.max_attempts):
            if attempt and (self._closing.is_set() or self._closing.wait(self.retry_base_s * 2 ** (attempt - 1))):
                break  # stopping: no more waiting for a webhook that fails
            problem, retry = self._post(body, event)
            if not problem:
                self._count("sent", event)
                self._note_ok()
                return
            if not retry:
                break
        self._count("failed", event)
        self._note_failure(event, problem)

    def _post(self, body: bytes, event: str) -> tuple[str, bool]:
        """One POST: ("", _) when delivered, else (problem, worth retrying)."""
        headers = {
            "Content-Type": "application/json",
            "User-Agent": f"plaita/{__version__}",
            "X-Plaita-Event": event,
        }
        if self._secret:
            headers[SIGNATURE_HEADER] = sign(self._secret, body)
        request = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        request.deadline_s = time.monotonic() + self.timeout_s  # type: ignore[attr-defined]
        try:
            with self._opener.open(request, timeout=self.timeout_s) as reply:
                reply.read(1024)  # a little of the answer, so keep-alive servers see a whole exchange
            return "", False
        except urllib.error.HTTPError as exc:
            exc.close()
            return f"HTTP {exc.code}", exc.code >= 500 or exc.code in RETRY_STATUSES
        except (OSError, ValueError, http.client.HTTPException) as exc:  # refused, reset, cut, DNS, TLS, bad URL
            reason = getattr(exc, "reason", None) or exc
            return f"{type(exc).__name__}: {reason}", True

    def _note_ok(self) -> None:
        if self._failing:
            self._failing = False
            logger.info("alert webhook %s delivers again", self.label)

    def _note_failure(self, event: str, problem: str) -> None:
        # Warn once per failing spell: a dead webhook must not flood the log it stands in for.
        level = logging.DEBUG if self._failing else logging.WARNING
        self._failing = True
        logger.log(
            level,
            "alert webhook %s: %s event not delivered (%s); counted in plaita_alerts_failed_total",
            self.label,
            event,
            redact_text(problem)[:200],
        )
